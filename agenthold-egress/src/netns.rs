//! Network namespaces: a handle by path, running code and commands inside one, and opening sockets there.
//!
//! The gateway's listeners live in the gateway namespace while the process that owns them (and dials every
//! upstream) stays in its own. A socket belongs to the namespace of the thread that *created* it, for its
//! whole life, whichever thread later uses it. So [`NetNs::run`] enters the namespace on a short-lived
//! thread (`setns(2)` changes only the calling thread), creates what it must there and returns it; the
//! thread then exits, and none of the caller's threads (tokio's workers included) ever changes namespace.
//!
//! Lifecycle helpers ([`NetNs::create`], [`NetNs::delete`], [`NetNs::veth_pair`], addresses, routes) shell
//! out to iproute2's `ip`: they run at setup, not per connection, and `ip` already speaks every netlink
//! dialect we need. Commands run inside a namespace through `nsenter --net=PATH` (see [`NetNs::command`]).

use std::fmt;
use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ipnet::IpNet;
use nix::sched::{CloneFlags, setns};
use socket2::{Domain, Protocol, Socket, Type};

use crate::{Error, Result};

/// Where iproute2 keeps named namespaces (`ip netns add NAME` bind-mounts the namespace on `DIR/NAME`).
pub const NAMED_NETNS_DIR: &str = "/var/run/netns";

/// Backlog of listeners opened by [`NetNs::bind_tcp`]: sandboxes may open many connections at once.
const LISTEN_BACKLOG: i32 = 1024;

/// A network namespace, identified by a file that refers to it (a bind mount under
/// [`NAMED_NETNS_DIR`], or `/proc/PID/ns/net`).
///
/// The handle holds no file descriptor: every use opens the path again, so a handle to a namespace that
/// has been deleted fails cleanly instead of keeping it alive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetNs {
    path: PathBuf,
    /// The iproute2 name, when the namespace was opened by name (needed to delete it).
    name: Option<String>,
}

impl NetNs {
    /// The namespace iproute2 calls `name` (`/var/run/netns/NAME`). It need not exist yet.
    pub fn named(name: &str) -> Self {
        Self {
            path: Path::new(NAMED_NETNS_DIR).join(name),
            name: Some(name.to_owned()),
        }
    }

    /// The namespace that the file at `path` refers to.
    pub fn from_path(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            name: None,
        }
    }

    /// The network namespace of process `pid` (`/proc/PID/ns/net`), e.g. a gateway container's init.
    pub fn of_pid(pid: u32) -> Self {
        Self::from_path(format!("/proc/{pid}/ns/net"))
    }

    /// Creates a new named namespace (`ip netns add NAME`) and returns its handle.
    ///
    /// Only names that are a single path component are accepted, because the name becomes a file name.
    pub fn create(name: &str) -> Result<Self> {
        let ns = Self::named(name);
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(ns.error(
                "creating",
                invalid_input(format!("invalid namespace name {name:?}")),
            ));
        }
        check_output(
            &ns,
            "creating",
            Command::new("ip").args(["netns", "add", name]).output(),
        )?;
        Ok(ns)
    }

    /// Deletes a named namespace (`ip netns delete NAME`). Its interfaces go with it once the last socket
    /// or process inside it is gone (veth pairs are destroyed as a whole).
    pub fn delete(&self) -> Result<()> {
        let Some(name) = &self.name else {
            return Err(self.error(
                "deleting",
                invalid_input("only named namespaces can be deleted".into()),
            ));
        };
        check_output(
            self,
            "deleting",
            Command::new("ip").args(["netns", "delete", name]).output(),
        )?;
        Ok(())
    }

    /// Whether the file naming the namespace exists.
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// The file that refers to the namespace.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The iproute2 name, for namespaces opened with [`NetNs::named`] or [`NetNs::create`].
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Runs `f` on a new thread that has entered this namespace and returns its result.
    ///
    /// Sockets `f` creates belong to this namespace for their whole life; processes it spawns start in it.
    /// The thread exits when `f` returns, so no other thread of the caller ever changes namespace. `f` may
    /// borrow from the caller (the thread is scoped); it blocks the caller until done, so keep it short.
    pub fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send,
        F: FnOnce() -> io::Result<T> + Send,
    {
        self.run_as("running code inside", f)
    }

    /// [`NetNs::run`] with the context an error reports.
    fn run_as<T, F>(&self, context: &str, f: F) -> Result<T>
    where
        T: Send,
        F: FnOnce() -> io::Result<T> + Send,
    {
        // Open before spawning so that a missing namespace is reported as such, not as a thread failure.
        let file = File::open(&self.path).map_err(|e| self.error("opening", e))?;
        let joined = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("netns-enter".into())
                .spawn_scoped(scope, move || -> Result<T> {
                    setns(&file, CloneFlags::CLONE_NEWNET)
                        .map_err(|errno| self.error("entering", io::Error::from(errno)))?;
                    // Nothing inside needs the descriptor any more.
                    drop(file);
                    f().map_err(|e| self.error(context, e))
                })
                .map(std::thread::ScopedJoinHandle::join)
        });
        match joined {
            Ok(Ok(result)) => result,
            // The closure panicked: re-raise it on the caller's thread, where it belongs.
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(e) => Err(self.error("spawning a thread to enter", e)),
        }
    }

    /// Opens a TCP listener on `addr` inside this namespace: `SO_REUSEADDR` (a restarted gateway re-binds
    /// while old connections linger in TIME_WAIT), non-blocking and listening, ready for
    /// `tokio::net::TcpListener::from_std`.
    pub fn bind_tcp(&self, addr: SocketAddr) -> Result<TcpListener> {
        self.run_as(&format!("binding TCP {addr} inside"), move || {
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            socket.set_reuse_address(true)?;
            socket.set_nonblocking(true)?;
            socket.bind(&addr.into())?;
            socket.listen(LISTEN_BACKLOG)?;
            Ok(socket.into())
        })
    }

    /// Opens a UDP socket bound to `addr` inside this namespace: `SO_REUSEADDR`, non-blocking, ready for
    /// `tokio::net::UdpSocket::from_std`.
    pub fn bind_udp(&self, addr: SocketAddr) -> Result<UdpSocket> {
        self.run_as(&format!("binding UDP {addr} inside"), move || {
            let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
            socket.set_reuse_address(true)?;
            socket.set_nonblocking(true)?;
            socket.bind(&addr.into())?;
            Ok(socket.into())
        })
    }

    /// Writes a `net.*` sysctl of this namespace (`key` in dotted form `net.ipv4.ip_forward`, or with `/`
    /// separators when a part contains a dot, like an interface name `net/ipv4/conf/eth0.5/rp_filter`).
    ///
    /// The kernel resolves `/proc/sys/net` against the network namespace of the thread that opens the
    /// file, so writing it from a thread inside the namespace changes that namespace's copy and never the
    /// host's. Only `net.*` keys are accepted: every other sysctl is global, and writing it from "inside"
    /// would change the whole machine.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = self.sysctl_path(key)?;
        self.run_as(&format!("writing sysctl {key}={value}"), || {
            std::fs::write(&path, value)
        })
    }

    /// Reads a `net.*` sysctl of this namespace (same key forms as [`NetNs::sysctl`]), trimmed.
    pub fn read_sysctl(&self, key: &str) -> Result<String> {
        let path = self.sysctl_path(key)?;
        self.run_as(&format!("reading sysctl {key}"), || {
            std::fs::read_to_string(&path).map(|s| s.trim().to_owned())
        })
    }

    /// `/proc/sys/...` for a `net.*` key, refusing anything that could escape the `net` subtree.
    fn sysctl_path(&self, key: &str) -> Result<PathBuf> {
        let relative = if key.contains('/') {
            key.to_owned()
        } else {
            key.replace('.', "/")
        };
        let parts: Vec<&str> = relative.split('/').collect();
        let valid = parts.first() == Some(&"net")
            && parts.len() > 1
            && parts.iter().all(|p| !p.is_empty() && *p != "." && *p != "..");
        if !valid {
            let problem = format!("sysctl {key:?} is not a per-namespace net.* key");
            return Err(self.error("checking a sysctl key for", invalid_input(problem)));
        }
        Ok(Path::new("/proc/sys").join(relative))
    }

    /// A command that runs `program` inside this namespace.
    ///
    /// Built as `nsenter --net=PATH -- PROGRAM`: it works for every kind of handle (named, any path,
    /// `/proc/PID/ns/net`), where `ip netns exec` knows only named namespaces, and it enters the network
    /// namespace only. Consequence: the program still sees the caller's mount namespace, so `/sys/class/net`
    /// and `/etc/resolv.conf` are the host's; netlink tools (`ip`, `nft`) and sockets are unaffected.
    /// Needs `nsenter` (util-linux) on `PATH`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut net = std::ffi::OsString::from("--net=");
        net.push(self.path.as_os_str());
        let mut command = Command::new("nsenter");
        command.arg(net).arg("--").arg(program);
        command
    }

    /// Runs `ip ARGS…` inside this namespace and returns its standard output; a failure carries `ip`'s
    /// standard error.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let context = format!("running `ip {}` inside", args.join(" "));
        let output = check_output(self, &context, self.command("ip").args(args).output())?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The interface that holds `addr` inside this namespace (`ip -o -4 addr show`), if any; a veth's
    /// `@peer` suffix is not part of the name.
    pub fn iface_with_addr(&self, addr: std::net::Ipv4Addr) -> Result<Option<String>> {
        let out = self.ip(&["-o", "-4", "addr", "show"])?;
        Ok(iface_in_listing(&out, addr))
    }

    /// Creates a veth pair: `name` in this namespace, `peer_name` in `peer`. Both ends start down.
    ///
    /// The pair is created from inside this namespace and its peer placed directly into `peer`, so the
    /// names only have to be unique inside each namespace, never in the host's.
    pub fn veth_pair(&self, name: &str, peer: &NetNs, peer_name: &str) -> Result<()> {
        let peer_path = peer.path.to_string_lossy();
        let args = [
            "link", "add", name, "type", "veth", "peer", "name", peer_name, "netns", &peer_path,
        ];
        self.ip(&args).map(drop)
    }

    /// Sets an interface up (`ip link set IF up`).
    pub fn link_up(&self, iface: &str) -> Result<()> {
        self.ip(&["link", "set", iface, "up"]).map(drop)
    }

    /// Adds an address with its prefix to an interface (`ip addr add ADDR/LEN dev IF`).
    pub fn add_address(&self, iface: &str, address: IpNet) -> Result<()> {
        self.ip(&["addr", "add", &address.to_string(), "dev", iface])
            .map(drop)
    }

    /// Adds a default route via `gateway` (`ip route add default via GW`).
    pub fn add_default_route(&self, gateway: IpAddr) -> Result<()> {
        self.ip(&["route", "add", "default", "via", &gateway.to_string()])
            .map(drop)
    }

    /// An [`Error::Netns`] about this namespace.
    fn error(&self, context: &str, source: io::Error) -> Error {
        Error::Netns {
            namespace: self.to_string(),
            context: context.to_owned(),
            source,
        }
    }
}

impl fmt::Display for NetNs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => f.write_str(name),
            None => write!(f, "{}", self.path.display()),
        }
    }
}

/// Turns a command's outcome into its output, or an error carrying its exit status and standard error.
fn check_output(ns: &NetNs, context: &str, output: io::Result<Output>) -> Result<Output> {
    let output = output.map_err(|e| ns.error(context, e))?;
    if output.status.success() {
        return Ok(output);
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let problem = format!("{} ({})", stderr.trim(), output.status);
    Err(ns.error(context, io::Error::other(problem)))
}

/// The interface of `ip -o -4 addr show` output whose address is `addr`.
fn iface_in_listing(listing: &str, addr: std::net::Ipv4Addr) -> Option<String> {
    let wanted = format!("{addr}/");
    listing.lines().find_map(|line| {
        // "9: eth0@if10    inet 10.213.77.254/24 brd ... scope global eth0"
        let mut words = line.split_whitespace();
        let iface = words.nth(1)?;
        let inet = words.skip_while(|w| *w != "inet").nth(1)?;
        inet.starts_with(&wanted)
            .then(|| iface.split('@').next().unwrap_or(iface).to_owned())
    })
}

fn invalid_input(problem: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_their_files() {
        let ns = NetNs::named("gw");
        assert_eq!(ns.path(), Path::new("/var/run/netns/gw"));
        assert_eq!(ns.name(), Some("gw"));
        assert_eq!(ns.to_string(), "gw");
        let ns = NetNs::of_pid(42);
        assert_eq!(ns.path(), Path::new("/proc/42/ns/net"));
        assert_eq!(ns.name(), None);
        assert_eq!(ns.to_string(), "/proc/42/ns/net");
    }

    #[test]
    fn commands_go_through_nsenter() {
        let command = NetNs::named("gw").command("nft");
        assert_eq!(command.get_program(), "nsenter");
        let args: Vec<_> = command.get_args().collect();
        assert_eq!(args, ["--net=/var/run/netns/gw", "--", "nft"]);
    }

    #[test]
    fn only_net_sysctls_are_accepted() {
        let ns = NetNs::named("gw");
        let path = ns.sysctl_path("net.ipv4.ip_forward").unwrap();
        assert_eq!(path, Path::new("/proc/sys/net/ipv4/ip_forward"));
        let path = ns.sysctl_path("net/ipv4/conf/eth0.5/rp_filter").unwrap();
        assert_eq!(path, Path::new("/proc/sys/net/ipv4/conf/eth0.5/rp_filter"));
        for bad in [
            "kernel.hostname",
            "net",
            "net/../kernel/hostname",
            "net..ipv4",
            "vm/swappiness",
            "",
        ] {
            let err = ns.sysctl_path(bad).unwrap_err();
            assert!(err.to_string().contains("net.* key"), "{bad}: {err}");
        }
    }

    #[test]
    fn interfaces_are_found_by_address() {
        let listing = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                       9: ah4@if10    inet 10.213.4.254/24 brd 10.213.4.255 scope global ah4\\ x\n\
                       9: ah4@if10    inet 10.213.4.2/24 scope global ah4\\ x\n";
        let at = |a: &str| iface_in_listing(listing, a.parse().unwrap());
        assert_eq!(at("10.213.4.2").as_deref(), Some("ah4"));
        assert_eq!(at("127.0.0.1").as_deref(), Some("lo"));
        assert_eq!(at("10.213.4.25"), None, "a prefix of another address is not it");
    }

    #[test]
    fn missing_namespaces_are_reported_by_name() {
        let ns = NetNs::named("agenthold-does-not-exist");
        let err = ns.run(|| Ok(())).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("agenthold-does-not-exist") && message.contains("opening"),
            "{message}"
        );
        let err = NetNs::create("a/b").unwrap_err();
        assert!(err.to_string().contains("invalid namespace name"), "{err}");
        let err = NetNs::of_pid(1).delete().unwrap_err();
        assert!(err.to_string().contains("only named namespaces"), "{err}");
    }
}
