//! Running clients inside a sandbox namespace: curl, `client.py`, and interactive clients, each with the
//! sandbox's own resolv.conf (see the parent module).

use std::net::Ipv4Addr;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::Harness;

/// The sandbox-side client (see `client.py`).
const CLIENT: &str = include_str!("../client.py");

/// Every command in a sandbox ends by itself, or is killed after this long.
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// A finished command: exit code and output.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    fn from(output: &Output) -> Self {
        Self {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// One line `curl -w` prints per transfer.
const WRITE_OUT: &str = "##%{http_code} %{http_connect} %{exitcode}\n";

/// What `curl -w` prints after the body, so that body and status come apart.
const STATUS_MARK: &str = "\n@@status=";

/// One curl run: exit code, status, body (when not written elsewhere), stderr.
#[derive(Debug)]
pub(crate) struct Curl {
    pub(crate) code: i32,
    pub(crate) status: u16,
    pub(crate) body: String,
    pub(crate) stderr: String,
}

impl Curl {
    /// The body as JSON (an echo server's answer); panics with the whole run otherwise.
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// Asserts a 200 from an echo upstream and returns its JSON.
    pub(crate) fn echo(&self) -> Value {
        assert_eq!((self.code, self.status), (0, 200), "{self:?}");
        let json = self.json();
        assert_eq!(
            json["upstream"],
            agenthold_testsupport::UPSTREAM_MARKER,
            "{self:?}"
        );
        json
    }
}

/// A client started in the background that talks line by line (the `hold` mode of `client.py`).
pub(crate) struct Interactive {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Interactive {
    /// The next JSON line it prints (waits up to `limit`).
    pub(crate) async fn next(&mut self, limit: Duration) -> Value {
        let line = tokio::time::timeout(limit, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("client printed nothing within {limit:?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("client exited without output"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// Send it one line (a `steps` request, JSON-encoded).
    pub(crate) async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Ask it to close its connection itself.
    pub(crate) async fn close(&mut self) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"close\n").await.unwrap();
    }
}

impl Drop for Interactive {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Harness {
    /// The command that runs `args` inside agent `i`'s sandbox with its own resolv.conf.
    fn command(&self, i: usize, args: &[&str]) -> Command {
        let resolv = self.dir.0.join(format!("resolv-{i}.conf"));
        let mut command = Command::from(self.agent(i).sandbox().command("unshare"));
        command
            .args([
                "--mount",
                "--",
                "sh",
                "-c",
                r#"mount --bind "$1" /etc/resolv.conf && shift && exec "$@""#,
            ])
            .arg("sh")
            .arg(resolv)
            .args(args)
            // Nothing from the test's own environment (a proxy variable, say) leaks into the sandbox.
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .kill_on_drop(true);
        command
    }

    /// Runs `args` in agent `i`'s sandbox with `env` and waits for it. The arguments are copied before the
    /// future starts, so runs built from temporaries can go side by side in `tokio::join!`.
    pub(crate) fn exec(
        &self,
        i: usize,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> impl Future<Output = Ran> + use<> {
        let mut command = self.command(i, args);
        command.envs(env.iter().copied());
        let what = format!("{args:?}");
        async move {
            let output = tokio::time::timeout(COMMAND_LIMIT, command.output())
                .await
                .unwrap_or_else(|_| panic!("{what} did not end within {COMMAND_LIMIT:?}"))
                .unwrap();
            Ran::from(&output)
        }
    }

    /// curl in agent `i`'s sandbox, trusting the test CA, with `env` (proxy variables).
    pub(crate) fn curl_env(
        &self,
        i: usize,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> impl Future<Output = Curl> + use<> {
        let ca = self.ca_file();
        let write_out = format!("{STATUS_MARK}%{{http_code}}");
        let mut full = vec![
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--cacert",
            &ca,
            "-w",
            &write_out,
        ];
        full.extend_from_slice(args);
        let run = self.exec(i, env, &full);
        async move {
            let ran = run.await;
            let (body, status) = ran.stdout.rsplit_once(STATUS_MARK).unwrap_or((&ran.stdout, "0"));
            Curl {
                code: ran.code,
                status: status.trim().parse().unwrap_or(0),
                body: body.to_owned(),
                stderr: ran.stderr,
            }
        }
    }

    pub(crate) fn curl(&self, i: usize, args: &[&str]) -> impl Future<Output = Curl> + use<> {
        self.curl_env(i, &[], args)
    }

    /// One curl process running one transfer per `(tag, args)` (separated by `--next`); returns, per tag,
    /// `(http_code, http_connect, exit code)`.
    pub(crate) async fn curl_batch(
        &self,
        i: usize,
        transfers: &[(String, Vec<String>)],
    ) -> Vec<(String, u16, u16, i32)> {
        let ca = self.ca_file();
        let mut args: Vec<String> = vec!["curl".into()];
        for (n, (_, transfer)) in transfers.iter().enumerate() {
            if n > 0 {
                args.push("--next".into());
            }
            for a in [
                "-sS",
                "--max-time",
                "3",
                "--cacert",
                &ca,
                "-o",
                "/dev/null",
                "-w",
                WRITE_OUT,
            ] {
                args.push(a.into());
            }
            args.extend(transfer.iter().cloned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let ran = self.exec(i, &[], &args).await;
        let lines: Vec<&str> = ran.stdout.lines().filter_map(|l| l.strip_prefix("##")).collect();
        assert_eq!(lines.len(), transfers.len(), "{ran:?}");
        transfers
            .iter()
            .zip(lines)
            .map(|((tag, _), line)| {
                let f: Vec<&str> = line.split(' ').collect();
                (
                    tag.clone(),
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                )
            })
            .collect()
    }

    /// Runs `client.py MODE ARGS…` in agent `i`'s sandbox and returns the JSON of its last line.
    pub(crate) fn py(&self, i: usize, args: &[&str]) -> impl Future<Output = Value> + use<> {
        let mut full = vec!["python3", "-c", CLIENT];
        full.extend_from_slice(args);
        let run = self.exec(i, &[], &full);
        let what = format!("{args:?}");
        async move {
            let ran = run.await;
            let last = ran.stdout.lines().last().unwrap_or_default();
            serde_json::from_str(last).unwrap_or_else(|e| panic!("client.py {what}: {e}: {ran:?}"))
        }
    }

    /// Starts `client.py MODE ARGS…` in agent `i`'s sandbox, to talk to it line by line.
    pub(crate) fn py_interactive(&self, i: usize, args: &[&str]) -> Interactive {
        let mut full = vec!["python3", "-c", CLIENT];
        full.extend_from_slice(args);
        let mut child = self
            .command(i, &full)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Interactive { child, stdin, lines }
    }

    /// Resolves `name` through agent `i`'s gateway DNS and returns the first address (panics without one).
    pub(crate) async fn resolve(&self, i: usize, name: &str) -> Ipv4Addr {
        let gw = self.gw(i).to_string();
        let answer = self.py(i, &["dns", &gw, name, "A"]).await;
        let addr = answer["addrs"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {answer}"));
        addr.parse().unwrap()
    }
}
