"""`agenthold.Client` and `agenthold.aio.Client` against a live `agenthold serve`.

One server for the session: the checkout's freshly built binary (`target/{debug,release}/agenthold`, or
under `$CARGO_TARGET_DIR`; built with `cargo build -q -p agenthold-server` when neither exists;
`AGENTHOLD_TEST_SERVER=/path/to/agenthold` overrides), a temp data dir, a free loopback port, DNS
forwarded to the NXDOMAIN responder of conftest (nothing leaves the machine). Users and tokens come from
`agenthold admin`. At the end every agent is deleted through the API, the server gets SIGTERM, and no
container, network or volume of its installation may remain.

Endpoints still being built (execs, request log, files) are looked up in `/api/v1/openapi.json`; a test
that needs a missing one is skipped with the route named, and runs as soon as the server has it.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

import pytest

import agenthold
from conftest import DnsResponder

ROOT = Path(__file__).resolve().parents[3]
E16_FIELDS = {"time", "kind", "host", "port", "method", "path", "status", "decision", "reason", "secret_injected"}


def server_binary() -> Path:
    """The checkout's server binary: the override, else the newest of target/{debug,release} (or under
    $CARGO_TARGET_DIR), else built now."""
    override = os.environ.get("AGENTHOLD_TEST_SERVER")
    if override:
        return Path(override)
    dirs = [ROOT / "target"]
    if os.environ.get("CARGO_TARGET_DIR"):
        dirs.insert(0, ROOT / os.environ["CARGO_TARGET_DIR"])
    found = [d / p / "agenthold" for d in dirs for p in ("debug", "release") if (d / p / "agenthold").is_file()]
    if not found:
        subprocess.run(["cargo", "build", "-q", "-p", "agenthold-server"], cwd=ROOT, check=True, timeout=1800)
        return server_binary()
    return max(found, key=lambda p: p.stat().st_mtime)


def instance_label(data_dir: Path) -> str:
    """The `agenthold.instance` label of the installation in `data_dir` (as agenthold-sandbox derives it)."""
    return hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]


class Server:
    """A running `agenthold serve` and its users."""

    def __init__(self, binary: Path, workdir: Path, dns: DnsResponder) -> None:
        self.binary = binary
        self.dir = workdir
        self.data_dir = workdir / "data"
        self.config = workdir / "config.yaml"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.config.write_text(
            f"data_dir: {self.data_dir}\nserver:\n  listen: 127.0.0.1:{port}\n"
            f"egress:\n  dns_upstream: {dns.addr}\n"
        )
        self.log = workdir / "serve.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(binary), "serve", "--config", str(self.config)],
                                         stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "AGENTHOLD_LOG": "info"})
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"agenthold serve exited with {self.proc.returncode}:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"agenthold serve did not answer /healthz:\n{self.log.read_text()}")
            time.sleep(0.1)
        with urllib.request.urlopen(f"{self.url}/api/v1/openapi.json", timeout=10) as r:
            doc = json.load(r)
        self.routes: Set[Tuple[str, str]] = {
            (method.upper(), re.sub(r"\{[^}]*\}", "{}", path))
            for path, ops in doc.get("paths", {}).items()
            for method in ops
        }
        self.tokens: List[str] = []

    def admin(self, *args: str) -> str:
        out = subprocess.run([str(self.binary), "admin", *args, "--config", str(self.config)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"agenthold admin {args}: {out.stderr}"
        return out.stdout.strip()

    def user(self, name: str) -> Tuple[str, str]:
        """A new user's id and a personal token of theirs."""
        user = self.admin("user", "create", "--name", name)
        token = self.admin("token", "create", "--user", user)
        self.tokens.append(token)
        return user, token

    def has(self, method: str, path: str) -> bool:
        return (method, re.sub(r"\{[^}]*\}", "{}", path)) in self.routes

    def need(self, method: str, path: str) -> None:
        """Skip the test when the server does not have the route yet."""
        if not self.has(method, path):
            pytest.skip(f"the server under test has no {method} {path} yet (not in /api/v1/openapi.json)")

    def engine_objects(self) -> List[str]:
        label = f"label=agenthold.instance={instance_label(self.data_dir)}"
        out: List[str] = []
        for args in (["ps", "-aq"], ["network", "ls", "-q"], ["volume", "ls", "-q"]):
            r = subprocess.run(["docker", *args, "--filter", label], capture_output=True, text=True, timeout=30)
            out += r.stdout.split()
        return out

    def stop(self) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def sweep(self) -> List[str]:
        """Remove whatever the installation left (containers, networks with their `DOCKER-USER` rules,
        volumes, the host table), as a crashed server would; answer the engine objects there were."""
        left = self.engine_objects()
        instance = instance_label(self.data_dir)
        label = f"label=agenthold.instance={instance}"

        def ids(*args: str) -> List[str]:
            return subprocess.run(["docker", *args, "--filter", label], capture_output=True, text=True,
                                  timeout=30).stdout.split()

        def run(*argv: str) -> str:
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=60).stdout

        containers = ids("ps", "-aq")
        if containers:
            run("docker", "rm", "-fv", *containers)
        for net in ids("network", "ls", "-q"):
            bridge = run("docker", "network", "inspect", "-f",
                         '{{index .Options "com.docker.network.bridge.name"}}', net).strip()
            for rule in run("iptables", "-S", "DOCKER-USER").splitlines():
                words = rule.replace('"', "").split()
                if bridge and words[:2] == ["-A", "DOCKER-USER"] and f"agenthold:{bridge}" in words:
                    run("iptables", "-D", *words[1:])
            run("docker", "network", "rm", net)
        volumes = ids("volume", "ls", "-q")
        if volumes:
            run("docker", "volume", "rm", "-f", *volumes)
        run("nft", "delete", "table", "inet", f"agenthold_host_{instance}")
        return left


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, dns: DnsResponder) -> Iterator[Server]:
    srv = Server(server_binary(), tmp_path_factory.mktemp("agenthold-serve").resolve(), dns)
    try:
        yield srv
        remaining = []
        for token in srv.tokens:
            with agenthold.Client(srv.url, token) as c:
                for ws in c.workspaces():
                    for sb in c.sandboxes(ws):
                        sb.remove()
                    remaining += c.sandboxes(ws)
        assert remaining == [], f"agents left after deleting every one: {remaining}"
        assert srv.stop() == 0, srv.log.read_text()
    finally:
        srv.stop()
        left = srv.sweep()
    assert left == [], f"engine objects left behind by the server: {left}"


@pytest.fixture(scope="session")
def alice(server: Server) -> Tuple[str, str]:
    return server.user("alice")


@pytest.fixture(scope="session")
def client(server: Server, alice: Tuple[str, str]) -> Iterator[agenthold.Client]:
    with agenthold.Client(server.url, alice[1]) as c:
        yield c


@pytest.fixture(scope="session")
def workspace(client: agenthold.Client) -> str:
    return str(client.create_workspace("py-" + uuid.uuid4().hex[:6])["id"])


@pytest.fixture(scope="module")
def shared(client: agenthold.Client, workspace: str) -> Iterator[agenthold.RemoteSandbox]:
    """One sandbox for the tests that do not change its life: allowlist example.com, HELLO=world."""
    with client.create_sandbox(allow=["example.com"], env={"HELLO": "world"}, workspace=workspace,
                               name="shared") as sb:
        yield sb


def test_me_and_workspaces(client: agenthold.Client, alice: Tuple[str, str]) -> None:
    me = client.me()
    assert me["id"] == alice[0] and me["name"] == "alice" and me["credential"] == "token"
    ws = client.create_workspace("second")
    assert ws["role"] == "owner" and isinstance(ws["id"], str)
    assert ws["id"] in [w["id"] for w in client.workspaces()]
    assert ws["id"] in [w["id"] for w in client.me()["workspaces"]]
    assert client.sandboxes(ws) == []


def test_create_sandbox_and_lifecycle(server: Server, client: agenthold.Client, workspace: str) -> None:
    name = "life-" + uuid.uuid4().hex[:6]
    sb = client.create_sandbox(policy=agenthold.Policy.allowlist(["example.com"]), workspace=workspace, name=name,
                               env={"A": "b"}, memory="256m", pids=256, labels={"team": "py"})
    try:
        assert isinstance(sb, agenthold.RemoteSandbox)
        assert sb.name == name and sb.workspace == workspace and sb.info["state"] == "running"
        assert sb.info["policy"] == {"mode": "allowlist", "entries": ["example.com"]}
        assert sb in client.sandboxes(workspace)
        assert client.sandbox(sb.id, workspace) == sb
        # The label the sweep looks for is the server's: while it runs, it has objects under it.
        assert server.engine_objects() != []
        assert sb.state() == "running"
        sb.stop()
        assert sb.state() == "stopped"
        sb.start()
        assert sb.state() == "running"
    finally:
        sb.remove()
    assert sb not in client.sandboxes(workspace)
    sb.remove()  # idempotent
    with pytest.raises(agenthold.SandboxError):
        sb.state()


def test_exec(server: Server, shared: agenthold.RemoteSandbox) -> None:
    server.need("POST", "/api/v1/workspaces/{ws}/agents/{agent}/execs")
    r = shared.exec(["sh", "-c", "echo $HELLO"])
    assert isinstance(r, agenthold.RemoteExecResult)
    assert (r.exit_code, r.stdout, r.stderr, r.ok, r.timed_out) == (0, b"world\n", b"", True, False)
    binary = shared.exec(["printf", "\\000\\377\\376ok"])
    assert binary.stdout == b"\x00\xff\xfeok"
    failed = shared.exec(["sh", "-c", "echo oops >&2; exit 3"], env={"X": "1"}, cwd="/tmp")
    assert (failed.exit_code, failed.stderr, failed.ok) == (3, b"oops\n", False)
    assert shared.exec(["pwd"], cwd="/tmp").stdout == b"/tmp\n"


def test_set_policy_reads_back(shared: agenthold.RemoteSandbox) -> None:
    try:
        shared.set_policy(agenthold.Policy.allowlist(["example.com", "*.npmjs.org", "github.com:22"]))
        assert shared.policy() == {"mode": "allowlist", "entries": ["example.com", "*.npmjs.org", "github.com:22"]}
        shared.set_policy(allow=["pypi.org"])
        assert shared.policy() == {"mode": "allowlist", "entries": ["pypi.org"]}
        shared.set_policy({"mode": "open", "entries": []})
        assert shared.policy()["mode"] == "open"
        assert shared.refresh()["policy"]["mode"] == "open"
    finally:
        shared.set_policy(allow=["example.com"])


def test_request_log_shape(server: Server, shared: agenthold.RemoteSandbox) -> None:
    server.need("GET", "/api/v1/workspaces/{ws}/agents/{agent}/requests")
    server.need("POST", "/api/v1/workspaces/{ws}/agents/{agent}/execs")
    host = f"denied-{uuid.uuid4().hex[:8]}.example.test"
    r = shared.exec(["curl", "-sS", "-m", "5", "--noproxy", "*", f"http://{host}/"], timeout=20)
    assert r.exit_code != 0
    deadline = time.monotonic() + 10
    while True:
        log = shared.request_log()
        mine = [e for e in log if e.get("host") == host]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert isinstance(log, list) and all(isinstance(e, dict) for e in log)
    assert mine, f"no entry for {host} in {log}"
    assert all(E16_FIELDS <= set(e) for e in log), log
    assert mine[0]["decision"] == "denied" and mine[0]["secret_injected"] is False


def test_files_round_trip(server: Server, shared: agenthold.RemoteSandbox) -> None:
    server.need("PUT", "/api/v1/workspaces/{ws}/agents/{agent}/files/content")
    server.need("GET", "/api/v1/workspaces/{ws}/agents/{agent}/files/content")
    data = bytes(range(256)) * 64
    shared.write_file("/tmp/pyclient/blob.bin", data)
    assert shared.read_file("/tmp/pyclient/blob.bin") == data
    shared.write_file("/tmp/pyclient/text.txt", "héllo\n")
    assert shared.read_file("/tmp/pyclient/text.txt") == "héllo\n".encode()
    with pytest.raises(agenthold.SandboxError) as e:
        shared.read_file("/tmp/pyclient/none")
    assert e.value.status == 404  # type: ignore[attr-defined]
    if server.has("GET", "/api/v1/workspaces/{ws}/agents/{agent}/files"):
        names = json.dumps(shared.list_files("/tmp/pyclient"))
        assert "blob.bin" in names and "text.txt" in names
    if server.has("DELETE", "/api/v1/workspaces/{ws}/agents/{agent}/files"):
        shared.delete_file("/tmp/pyclient/text.txt")
        with pytest.raises(agenthold.SandboxError):
            shared.read_file("/tmp/pyclient/text.txt")


def test_errors(server: Server, client: agenthold.Client, workspace: str, shared: agenthold.RemoteSandbox) -> None:
    _, bob_token = server.user("bob")
    with agenthold.Client(server.url, bob_token) as bob:
        bobs = bob.create_workspace("bobs")
        # Another workspace's sandbox: 404, whether named in its workspace or in bob's own.
        for ws in (workspace, bobs["id"]):
            with pytest.raises(agenthold.SandboxError) as e:
                bob.sandbox(shared.id, ws).state()
            err = e.value
            assert isinstance(err, agenthold.RemoteError)
            assert (err.status, err.code) == (404, "not_found")
            assert err.method == "GET" and shared.id in err.path
            assert bob_token not in str(err) and bob_token not in repr(err.args)
        assert bob_token not in repr(bob)
    # An invalid policy entry, checked by the server: 400 with its code and the entry named.
    with pytest.raises(agenthold.PolicyError) as p:
        shared.set_policy(allow=["not a host!"])
    assert isinstance(p.value, agenthold.RemoteError)
    assert (p.value.status, p.value.code) == (400, "bad_request")
    assert "not a host!" in p.value.detail
    assert shared.policy()["entries"] == ["example.com"]
    with pytest.raises(agenthold.SandboxError) as bad:
        client.create_sandbox(allow=["nope nope"], workspace=workspace)
    assert bad.value.status == 400  # type: ignore[attr-defined]
    # A token the server does not know: 401, an agenthold.Error but not a sandbox's fault.
    wrong = "ahp_" + "x" * 43
    with pytest.raises(agenthold.Error) as u:
        agenthold.Client(server.url, wrong).me()
    assert not isinstance(u.value, agenthold.SandboxError)
    assert (u.value.status, u.value.code) == (401, "unauthorized")  # type: ignore[attr-defined]
    assert wrong not in str(u.value)
    # A name taken in the workspace: 409.
    with pytest.raises(agenthold.SandboxError) as taken:
        client.create_sandbox(workspace=workspace, name="shared")
    assert taken.value.status == 409  # type: ignore[attr-defined]


def test_aio_client_leaves_no_thread(server: Server, alice: Tuple[str, str], workspace: str) -> None:
    before = set(threading.enumerate())
    has_exec = server.has("POST", "/api/v1/workspaces/{ws}/agents/{agent}/execs")
    has_files = server.has("PUT", "/api/v1/workspaces/{ws}/agents/{agent}/files/content")

    async def main() -> None:
        async with agenthold.aio.Client(server.url, alice[1], workspace=workspace) as rt:
            me, spaces = await asyncio.gather(rt.me(), rt.workspaces())
            assert me["id"] == alice[0] and workspace in [w["id"] for w in spaces]
            async with await rt.create_sandbox(allow=["example.com"], env={"HELLO": "aio"}) as sb:
                assert isinstance(sb, agenthold.aio.RemoteSandbox)
                assert sb in await rt.sandboxes()
                await sb.set_policy(allow=["pypi.org"])
                states = await asyncio.gather(sb.state(), sb.policy(), sb.refresh())
                assert states[0] == "running" and states[1]["entries"] == ["pypi.org"]
                with pytest.raises(agenthold.PolicyError):
                    await sb.set_policy(allow=["bad entry!"])
                if has_exec:
                    results = await asyncio.gather(sb.exec(["sh", "-c", "echo $HELLO"]),
                                                   sb.exec(["sh", "-c", "sleep 0.3; exit 4"]))
                    assert results[0].stdout == b"aio\n" and results[1].exit_code == 4
                if has_files:
                    await sb.write_file("/tmp/aio.txt", b"\x00aio")
                    assert await sb.read_file("/tmp/aio.txt") == b"\x00aio"
            assert sb not in await rt.sandboxes()
            with pytest.raises(agenthold.SandboxError):
                await rt.sandbox(sb.id).state()

    asyncio.run(main())
    assert set(threading.enumerate()) == before


#: A Claude stand-in for the `custom` harness: reads the prompt on stdin, prints stream-json lines.
CLAUDE_LIKE = r"""
import json, sys, time
prompt = sys.stdin.read()
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0
def out(o):
    print(json.dumps(o), flush=True)
    time.sleep(pause)
out({"type": "system", "subtype": "init", "session_id": "sess-py", "model": "stand-in"})
out({"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}})
out({"type": "result", "subtype": "success", "is_error": False, "result": prompt, "session_id": "sess-py",
     "total_cost_usd": 0.5, "usage": {"input_tokens": 1, "output_tokens": 2}})
"""
RUNS = "/api/v1/workspaces/{ws}/agents/{agent}/runs"


# covers: P1
def test_run_iterates_its_events_to_the_end(server: Server, client: agenthold.Client, workspace: str,
                                            shared: agenthold.RemoteSandbox) -> None:
    server.need("POST", RUNS)
    prompt = "it's $(not) run; `by` a shell\n\u00fcn\u00efcode"
    run = client.run(workspace, shared, "custom", prompt, argv=["python3", "-c", CLAUDE_LIKE])
    assert isinstance(run, agenthold.Run) and run.id.startswith("run_") and run.state == "running"
    events = list(run)
    assert [e["type"] for e in events] == ["state", "session", "message", "usage", "result", "state", "end"]
    assert events[-1] == {"type": "end", "state": "succeeded", "exit_code": 0}
    assert events[4]["text"] == prompt
    assert run.last_event_id == f"{run.id}.{len(events)}"
    info = run.refresh()
    assert info["state"] == "succeeded" and info["session_id"] == "sess-py" and info["result"] == prompt
    assert info["usage"] == {"input_tokens": 1, "output_tokens": 2, "cost_usd": 0.5}
    # Iterating again after the end replays nothing more; from the start replays everything.
    assert list(run) == []
    assert list(run.events(after=f"{run.id}.0")) == events
    assert run.id in [r.id for r in client.runs(workspace, shared.id)]
    assert len(run.output()) == 3
    # A cancelled run ends `cancelled`; bad input is a SandboxError with the server's code.
    slow = client.run(None, shared, "custom", "", argv=["sleep", "1007"])
    assert slow.cancel()["state"] == "cancelled"
    assert list(slow)[-1]["state"] == "cancelled"
    with pytest.raises(agenthold.SandboxError) as e:
        client.run(workspace, shared.id, "custom", "x" * (256 * 1024 + 1), argv=["true"])
    assert e.value.status == 413 and e.value.code == "prompt_too_large"
    with pytest.raises(agenthold.SandboxError):
        client.run(workspace, shared.id, "claude", "x", argv=["sh"])
    with pytest.raises(ValueError):
        client.run(workspace, shared.id, "bash", "x")


# covers: P1
def test_aio_run_iterates_its_events(server: Server, alice: Tuple[str, str], workspace: str,
                                     shared: agenthold.RemoteSandbox) -> None:
    server.need("POST", RUNS)
    before = set(threading.enumerate())

    async def main() -> None:
        async with agenthold.aio.Client(server.url, alice[1], workspace=workspace) as rt:
            run = await rt.run(None, shared.id, "custom", "aio", argv=["python3", "-c", CLAUDE_LIKE, "0.2"])
            assert isinstance(run, agenthold.aio.Run)
            types = [e["type"] async for e in run]
            assert types[-1] == "end" and "result" in types
            assert (await run.refresh())["result"] == "aio"
            # Leaving an iteration early stops its thread.
            again = await rt.run(None, shared.id, "custom", "early", argv=["python3", "-c", CLAUDE_LIKE, "0.5"])
            async for event in again:
                assert event["type"] == "state"
                break
            assert (await again.wait())["state"] == "succeeded"

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) == before


def _public(cls: type) -> Set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


# Present on one side only, by design: the embedded runtime's process-local parts, and the server's
# users, workspaces and extra views.
EMBEDDED_ONLY = {"data_dir", "ca_pem", "warm_pool_ready", "exec_stream", "runtime"}
REMOTE_ONLY = {"url", "workspace", "me", "workspaces", "create_workspace", "client", "name", "info", "policy",
               "refresh", "list_files", "delete_file", "run", "runs"}


@pytest.mark.parametrize(
    ("embedded", "remote", "embedded_extra", "remote_extra"),
    [
        (agenthold.Runtime, agenthold.Client, set(), set()),
        (agenthold.Sandbox, agenthold.RemoteSandbox, set(), set()),
        (agenthold.aio.Runtime, agenthold.aio.Client, {"start"}, set()),
        (agenthold.aio.Sandbox, agenthold.aio.RemoteSandbox, set(), {"sync"}),
        (agenthold.ExecResult, agenthold.RemoteExecResult, set(), {"id", "from_json"}),
    ],
)
def test_runtime_and_client_have_the_same_shape(embedded: type, remote: type, embedded_extra: Set[str],
                                                remote_extra: Set[str]) -> None:
    assert _public(embedded) - EMBEDDED_ONLY - embedded_extra == _public(remote) - REMOTE_ONLY - remote_extra
    for name in sorted(_public(embedded) & _public(remote)):
        a, b = getattr(embedded, name), getattr(remote, name)
        if not callable(a):
            continue
        assert inspect.iscoroutinefunction(a) == inspect.iscoroutinefunction(b), name
        params = inspect.signature(a).parameters
        ours = [p for p in params if p not in ("self", "secrets", "stdin")]
        theirs = [p for p in inspect.signature(b).parameters if p != "self"]
        assert set(ours) <= set(theirs), f"{remote.__name__}.{name} lacks {set(ours) - set(theirs)}"
        # The first positional arguments keep their places.
        positional = [p for p in ours if params[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD][:2]
        assert theirs[:len(positional)] == positional, name


def test_client_arguments_are_checked() -> None:
    token = "ahp_" + uuid.uuid4().hex
    for url in ("ftp://x", "127.0.0.1:8080", "http://user:pw@host", "http://h/?q=1"):
        with pytest.raises(ValueError) as e:
            agenthold.Client(url, token)
        assert token not in str(e.value)
    with pytest.raises(ValueError) as e:
        agenthold.Client("http://127.0.0.1:1", token + "\r\nX-Injected: 1")
    assert token not in str(e.value)
    c = agenthold.Client("http://127.0.0.1:1/base/", token)
    assert c.url == "http://127.0.0.1:1/base" and token not in repr(c)
    c.close()
    with pytest.raises(agenthold.SandboxError, match="closed"):
        c.me()
    handle = agenthold.Client("http://127.0.0.1:1", token).sandbox("x", "w")
    with pytest.raises(TypeError):
        handle.set_policy(allow="github.com")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        handle.set_policy()


def test_every_client_member_has_a_docstring() -> None:
    for cls in (agenthold.Client, agenthold.RemoteSandbox, agenthold.RemoteExecResult, agenthold.RemoteError,
                agenthold.aio.Client, agenthold.aio.RemoteSandbox, agenthold.Run, agenthold.aio.Run):
        assert (cls.__doc__ or "").strip(), cls.__name__
        for attr, member in vars(cls).items():
            if not attr.startswith("_"):
                assert (getattr(member, "__doc__", None) or "").strip(), f"{cls.__name__}.{attr}"
