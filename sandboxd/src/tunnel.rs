//! The tunnel client (S2): proves this boot to the runtime with the boot token and keeps the connection alive.
//! Protocol version 1 is described in the crate docs; this side is plain blocking std networking on one thread,
//! with a timeout on every connect, read and write, and reconnection with backoff forever (S12).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use sandboxd::contract::{ENV_AGENT, ENV_TUNNEL, tunnel as wire};

use crate::token::BootToken;

/// Longest line either side may send, newline included.
const MAX_LINE: usize = wire::MAX_LINE;

/// Everything the client needs; built from the environment by [`TunnelConfig::from_env`].
#[derive(Debug, Clone)]
pub(crate) struct TunnelConfig {
    /// The runtime's tunnel listener (`$AGENTHOLD_TUNNEL`).
    pub(crate) addr: SocketAddr,
    /// This sandbox's agent id (`$AGENTHOLD_AGENT`), informative only: the token identifies the boot.
    pub(crate) agent: String,
    /// The boot token.
    pub(crate) token: BootToken,
    /// Silence after which a `PING` is sent (10 s).
    pub(crate) ping_every: Duration,
    /// Timeout of connect, writes, the `OK` and each `PONG` (10 s).
    pub(crate) timeout: Duration,
    /// First reconnect delay (1 s), doubled after each failure.
    pub(crate) backoff: Duration,
    /// Largest reconnect delay (10 s).
    pub(crate) backoff_max: Duration,
}

/// Reads a duration in milliseconds from a test-only environment variable, clamped to at least 10 ms.
fn env_ms(name: &str, default_ms: u64) -> Duration {
    let ms = std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(default_ms);
    Duration::from_millis(ms.max(10))
}

/// Whether `agent` can go into the hello line (see [`wire::valid_agent`]).
fn valid_agent(agent: &str) -> bool {
    wire::valid_agent(agent)
}

/// A duration in whole milliseconds, for the defaults of the test-only knobs.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl TunnelConfig {
    /// Reads `AGENTHOLD_TUNNEL`, `AGENTHOLD_AGENT` and the test-only timing knobs. `Ok(None)` when
    /// `AGENTHOLD_TUNNEL` is unset (sandboxd running outside agenthold); `Err` with a message when a value is bad.
    pub(crate) fn from_env(token: BootToken) -> Result<Option<Self>, String> {
        let Some(addr) = std::env::var_os(ENV_TUNNEL) else {
            return Ok(None);
        };
        let addr = addr
            .to_str()
            .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            .ok_or_else(|| format!("{ENV_TUNNEL}={addr:?}: expected IP:PORT (no names are resolved)"))?;
        let agent = std::env::var(ENV_AGENT).unwrap_or_default();
        if !valid_agent(&agent) {
            return Err(format!(
                "{ENV_AGENT}={agent:?}: expected a non-empty printable id without spaces"
            ));
        }
        Ok(Some(Self {
            addr,
            agent,
            token,
            ping_every: env_ms("AGENTHOLD_TUNNEL_PING_MS", ms(wire::PING_EVERY)),
            timeout: env_ms("AGENTHOLD_TUNNEL_TIMEOUT_MS", ms(wire::REPLY_TIMEOUT)),
            backoff: env_ms("AGENTHOLD_TUNNEL_BACKOFF_MS", 1_000),
            backoff_max: env_ms("AGENTHOLD_TUNNEL_BACKOFF_MAX_MS", 10_000),
        }))
    }

    /// The hello line, newline included. Contains the token: write it to the socket only.
    pub(crate) fn hello(&self) -> String {
        wire::hello(&self.agent, self.token.expose())
    }
}

/// How a session ended. Messages never contain the token.
#[derive(Debug)]
enum SessionEnd {
    /// Connecting, reading or writing failed (timeouts included).
    Io(&'static str, std::io::Error),
    /// The server closed the connection.
    Closed(&'static str),
    /// The server answered `ERR <reason>`.
    Rejected(String),
    /// The server sent a line that is not part of the protocol here.
    Protocol(&'static str, String),
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(step, err) => write!(f, "{step}: {err}"),
            Self::Closed(step) => write!(f, "{step}: connection closed by the server"),
            Self::Rejected(reason) => write!(f, "rejected by the server: {reason}"),
            Self::Protocol(step, line) => write!(f, "{step}: unexpected line {line:?}"),
        }
    }
}

/// Printable ASCII of an untrusted line, cut at 120 characters, for the log.
fn sanitize(line: &[u8]) -> String {
    line.iter()
        .take(120)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect()
}

/// A connection with a line buffer and deadline-bounded reads.
struct Conn {
    /// The socket.
    stream: TcpStream,
    /// Bytes read but not yet returned as lines.
    buf: Vec<u8>,
}

/// Result of waiting for the next line.
enum Line {
    /// A complete line, without its `\n`.
    Text(Vec<u8>),
    /// The deadline passed with no complete line.
    TimedOut,
}

impl Conn {
    /// Reads the next line, waiting at most until `deadline`.
    fn read_line(&mut self, deadline: Instant, step: &'static str) -> Result<Line, SessionEnd> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(Line::Text(line));
            }
            if self.buf.len() >= MAX_LINE {
                return Err(SessionEnd::Protocol(step, sanitize(&self.buf)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Line::TimedOut);
            }
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|e| SessionEnd::Io(step, e))?;
            let mut chunk = [0u8; MAX_LINE];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(SessionEnd::Closed(step)),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(SessionEnd::Io(step, err)),
            }
        }
    }

    /// Reads one line that must arrive before `deadline`.
    fn expect_line(&mut self, deadline: Instant, step: &'static str) -> Result<Vec<u8>, SessionEnd> {
        match self.read_line(deadline, step)? {
            Line::Text(line) => Ok(line),
            Line::TimedOut => Err(SessionEnd::Io(step, std::io::ErrorKind::TimedOut.into())),
        }
    }

    /// Writes all of `bytes` (the socket has a write timeout).
    fn send(&mut self, bytes: &[u8], step: &'static str) -> Result<(), SessionEnd> {
        self.stream.write_all(bytes).map_err(|e| SessionEnd::Io(step, e))
    }
}

/// One session: connect, authenticate, then keep alive until something fails. `on_ok` runs after the `OK`.
fn session(cfg: &TunnelConfig, on_ok: &mut dyn FnMut()) -> SessionEnd {
    let stream = match TcpStream::connect_timeout(&cfg.addr, cfg.timeout) {
        Ok(stream) => stream,
        Err(err) => return SessionEnd::Io("connect", err),
    };
    let setup = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_write_timeout(Some(cfg.timeout)));
    if let Err(err) = setup {
        return SessionEnd::Io("connect", err);
    }
    let mut conn = Conn {
        stream,
        buf: Vec::new(),
    };
    match authenticated(cfg, &mut conn, on_ok) {
        Ok(never) => match never {},
        Err(end) => end,
    }
}

/// The protocol on an open connection; returns only when the session ends.
fn authenticated(
    cfg: &TunnelConfig,
    conn: &mut Conn,
    on_ok: &mut dyn FnMut(),
) -> Result<std::convert::Infallible, SessionEnd> {
    conn.send(cfg.hello().as_bytes(), "hello")?;
    let answer = conn.expect_line(Instant::now() + cfg.timeout, "hello")?;
    if answer.as_slice() != wire::OK.as_bytes() {
        return Err(match answer.strip_prefix(wire::ERR.as_bytes()) {
            Some(reason) => SessionEnd::Rejected(sanitize(reason)),
            None => SessionEnd::Protocol("hello", sanitize(&answer)),
        });
    }
    on_ok();
    loop {
        // Wait out the ping interval while watching the socket: a close or stray bytes end the session now.
        if let Line::Text(line) = conn.read_line(Instant::now() + cfg.ping_every, "idle")? {
            return Err(SessionEnd::Protocol("idle", sanitize(&line)));
        }
        conn.send(wire::line(wire::PING).as_bytes(), "ping")?;
        let line = conn.expect_line(Instant::now() + cfg.timeout, "ping")?;
        if line.as_slice() != wire::PONG.as_bytes() {
            return Err(SessionEnd::Protocol("ping", sanitize(&line)));
        }
    }
}

/// The longest wait for the sandbox's network before the first connect ([`wait_for_network`]).
const NETWORK_WAIT: Duration = Duration::from_secs(10);

/// How often [`wait_for_network`] looks.
const NETWORK_POLL: Duration = Duration::from_millis(5);

/// Wait (at most `limit`) until this network namespace has a route to `addr`: the runtime plugs the sandbox
/// into its network just after the start (it has loopback only until then), and a first connect before that
/// would fail at once and cost a whole backoff step. The probe is a UDP `connect`, which only looks up the
/// route and sends nothing. A namespace that never gets one just goes on after `limit`.
fn wait_for_network(addr: SocketAddr, limit: Duration) {
    let deadline = Instant::now() + limit;
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let routed = || {
        UdpSocket::bind(local)
            .and_then(|probe| probe.connect(addr))
            .is_ok()
    };
    while !routed() && Instant::now() < deadline {
        std::thread::sleep(NETWORK_POLL);
    }
}

/// Runs the client forever: sessions with backoff in between. Logs state changes, not every retry.
pub(crate) fn run_forever(cfg: &TunnelConfig) -> ! {
    wait_for_network(cfg.addr, NETWORK_WAIT);
    let mut backoff = cfg.backoff;
    let mut last_error: Option<String> = None;
    loop {
        let mut connected = false;
        let end = session(cfg, &mut || {
            connected = true;
            crate::log!("tunnel: connected to {} as {}", cfg.addr, cfg.agent);
        });
        if connected {
            backoff = cfg.backoff;
            last_error = None;
        }
        let message = end.to_string();
        if last_error.as_deref() != Some(message.as_str()) {
            crate::log!(
                "tunnel: {message}; retrying (backoff up to {} ms)",
                cfg.backoff_max.as_millis()
            );
            last_error = Some(message);
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(cfg.backoff_max);
    }
}

/// Starts the client on a background thread.
pub(crate) fn spawn(cfg: TunnelConfig) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tunnel".into())
        .spawn(move || run_forever(&cfg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead as _, BufReader};
    use std::net::TcpListener;

    const TOKEN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn config(addr: SocketAddr) -> TunnelConfig {
        TunnelConfig {
            addr,
            agent: "agent-1".into(),
            token: BootToken::parse(TOKEN.as_bytes()).expect("token"),
            ping_every: Duration::from_millis(20),
            timeout: Duration::from_millis(300),
            backoff: Duration::from_millis(10),
            backoff_max: Duration::from_millis(40),
        }
    }

    #[test]
    fn hello_line_format() {
        let cfg = config("127.0.0.1:1".parse().expect("addr"));
        assert_eq!(cfg.hello(), format!("AGENTHOLD-TUNNEL 1 agent-1 {TOKEN}\n"));
    }

    #[test]
    fn agent_ids_are_checked() {
        assert!(valid_agent("ag_1-x.y"));
        assert!(!valid_agent("") && !valid_agent("a b") && !valid_agent("a\nb"));
    }

    /// Serves one connection with `script(reader, writer)` and returns what `session` reported.
    fn one_session(
        script: impl FnOnce(&mut BufReader<TcpStream>, &mut TcpStream) + Send + 'static,
    ) -> SessionEnd {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let cfg = config(listener.local_addr().expect("addr"));
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            script(&mut reader, &mut stream);
        });
        let end = session(&cfg, &mut || {});
        server.join().expect("server");
        end
    }

    #[test]
    fn err_answer_is_a_rejection() {
        let end = one_session(|reader, writer| {
            let mut hello = String::new();
            reader.read_line(&mut hello).expect("hello");
            writer.write_all(b"ERR unknown token\n").expect("write");
        });
        assert!(
            matches!(&end, SessionEnd::Rejected(r) if r == "unknown token"),
            "{end:?}"
        );
        assert!(!end.to_string().contains(TOKEN));
    }

    #[test]
    fn silence_after_ping_times_out() {
        let end = one_session(|reader, writer| {
            let mut line = String::new();
            reader.read_line(&mut line).expect("hello");
            writer.write_all(b"OK\n").expect("ok");
            line.clear();
            reader.read_line(&mut line).expect("ping");
            assert_eq!(line, "PING\n");
            std::thread::sleep(Duration::from_millis(500));
        });
        assert!(
            matches!(&end, SessionEnd::Io("ping", e) if e.kind() == std::io::ErrorKind::TimedOut),
            "{end:?}"
        );
    }

    #[test]
    fn overlong_or_stray_lines_end_the_session() {
        let end = one_session(|reader, writer| {
            let mut line = String::new();
            reader.read_line(&mut line).expect("hello");
            writer.write_all(&[b'x'; 300]).expect("write");
        });
        assert!(matches!(end, SessionEnd::Protocol("hello", _)), "{end:?}");
        let end = one_session(|reader, writer| {
            let mut line = String::new();
            reader.read_line(&mut line).expect("hello");
            writer.write_all(b"OK\nHELLO?\n").expect("write");
        });
        assert!(
            matches!(&end, SessionEnd::Protocol("idle", l) if l == "HELLO?"),
            "{end:?}"
        );
    }

    #[test]
    fn refused_connect_is_an_io_error() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        assert!(matches!(
            session(&config(addr), &mut || {}),
            SessionEnd::Io("connect", _)
        ));
    }

    #[test]
    fn a_routed_address_is_not_waited_for() {
        // The probe itself must work: were it to fail everywhere, every boot would wait the whole limit.
        let limit = Duration::from_secs(60);
        let started = Instant::now();
        wait_for_network("127.0.0.1:9".parse().expect("addr"), limit);
        wait_for_network("[::1]:9".parse().expect("addr"), Duration::from_millis(50));
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
