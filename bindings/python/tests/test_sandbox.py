"""Sandboxes from Python: commands, files, lifecycle, and the error paths (real Docker)."""

from __future__ import annotations

import hashlib
import subprocess
import time

import pytest

import agenthold
from conftest import API, curl


def test_exec_exit_codes_and_streams(shared_sandbox: agenthold.Sandbox) -> None:
    r = shared_sandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.exit_code, r.stdout, r.stderr, r.ok, r.timed_out) == (3, b"out\n", b"err\n", False, False)
    assert shared_sandbox.exec(["true"]).ok
    killed = shared_sandbox.exec(["sh", "-c", "kill -9 $$"])
    assert killed.exit_code == 137
    missing = shared_sandbox.exec(["/no/such/program"])
    assert missing.exit_code != 0


def test_exec_env_cwd_stdin(shared_sandbox: agenthold.Sandbox) -> None:
    r = shared_sandbox.exec(["sh", "-c", 'echo "$SHARED $EXTRA"; pwd'], env={"EXTRA": "x y"}, cwd="/usr/lib")
    assert r.stdout == b"yes x y\n/usr/lib\n"
    assert shared_sandbox.exec(["cat"], stdin=b"\x00\x01bytes").stdout == b"\x00\x01bytes"
    assert shared_sandbox.exec(["cat"], stdin="text").stdout == b"text"


def test_exec_timeout_kills_the_command(shared_sandbox: agenthold.Sandbox) -> None:
    t0 = time.monotonic()
    r = shared_sandbox.exec(["sh", "-c", "echo started; sleep 30 & sleep 30"], timeout=1.0)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code == 124
    assert r.stdout == b"started\n"
    assert elapsed < 10
    left = shared_sandbox.exec(["sh", "-c", "pgrep -x sleep || true"]).stdout
    assert left == b""


def test_exec_argument_errors(shared_sandbox: agenthold.Sandbox) -> None:
    with pytest.raises(TypeError, match="list of strings"):
        shared_sandbox.exec("echo hi")  # type: ignore[arg-type]
    with pytest.raises(agenthold.SandboxError, match="argv is empty"):
        shared_sandbox.exec([])
    with pytest.raises(agenthold.SandboxError, match="timeout"):
        shared_sandbox.exec(["true"], timeout=-1)
    with pytest.raises(agenthold.SandboxError, match="absolute"):
        shared_sandbox.exec(["true"], cwd="relative/dir")


def test_exec_stream(shared_sandbox: agenthold.Sandbox) -> None:
    stream = shared_sandbox.exec_stream(["sh", "-c", "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 5"])
    assert stream.exit_code is None
    got = list(stream)
    assert [s for s, _ in got] == ["stdout", "stderr", "stdout"]
    assert b"".join(d for s, d in got if s == "stdout") == b"one\nthree\n"
    assert stream.exit_code == 5


def test_file_round_trip(shared_sandbox: agenthold.Sandbox) -> None:
    data = bytes(range(256)) * 1000
    shared_sandbox.write_file("/tmp/py/nested/dir/blob.bin", data)
    assert shared_sandbox.read_file("/tmp/py/nested/dir/blob.bin") == data
    shared_sandbox.write_file("/tmp/py/text.txt", "héllo")
    assert shared_sandbox.read_file("/tmp/py/text.txt") == "héllo".encode()
    assert shared_sandbox.exec(["cat", "/tmp/py/text.txt"]).stdout == "héllo".encode()
    shared_sandbox.write_file("/tmp/py/text.txt", b"replaced")
    assert shared_sandbox.read_file("/tmp/py/text.txt") == b"replaced"
    shared_sandbox.write_file("/tmp/py/empty", b"")
    assert shared_sandbox.read_file("/tmp/py/empty") == b""


def test_file_errors(shared_sandbox: agenthold.Sandbox) -> None:
    with pytest.raises(agenthold.SandboxError, match="/tmp/does-not-exist"):
        shared_sandbox.read_file("/tmp/does-not-exist")
    with pytest.raises(agenthold.SandboxError, match="absolute"):
        shared_sandbox.write_file("relative.txt", b"x")


def test_lifecycle_and_limits(rt: agenthold.Runtime) -> None:
    sb = rt.create_sandbox(cpus=0.5, memory=256 * 1024 * 1024, pids=128, env={"A": "1"})
    try:
        assert isinstance(sb.id, str) and sb.id
        assert sb in rt.sandboxes()
        assert sb.state() == "running"
        limit = sb.exec(["sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null || "
                                    "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"]).stdout.strip()
        assert limit == str(256 * 1024 * 1024).encode()
        sb.write_file("/home/kept.txt", b"still here")
        sb.stop()
        assert sb.state() == "stopped"
        # The engine's 409 arrives as a class (the kind travels with the error), with what to do.
        with pytest.raises(agenthold.SandboxError, match=r"start\(\) first"):
            sb.exec(["true"])
        sb.start()
        assert sb.state() == "running"
        assert sb.read_file("/home/kept.txt") == b"still here"
        assert sb.exec(["sh", "-c", "echo $A"]).stdout == b"1\n"
    finally:
        sb.remove()
    assert sb not in rt.sandboxes()
    sb.remove()  # idempotent
    with pytest.raises(agenthold.SandboxError):
        sb.exec(["true"])


def test_sandbox_context_manager_removes(rt: agenthold.Runtime) -> None:
    with rt.create_sandbox() as sb:
        assert sb.exec(["true"]).ok
    assert sb not in rt.sandboxes()


def test_missing_image_names_the_build_command(rt: agenthold.Runtime) -> None:
    before = set(rt.sandboxes())
    with pytest.raises((agenthold.SandboxError, agenthold.EngineError), match="agenthold image build-dev"):
        rt.create_sandbox(image="agenthold/dev:no-such-tag")
    with pytest.raises((agenthold.SandboxError, agenthold.EngineError), match="agenthold image build-dev"):
        rt.create_sandbox(image="example.invalid/nothing:1")
    assert set(rt.sandboxes()) == before  # nothing left behind


def test_bad_limits(rt: agenthold.Runtime) -> None:
    with pytest.raises(agenthold.SandboxError, match="cpus"):
        rt.create_sandbox(cpus=0)
    with pytest.raises(agenthold.SandboxError, match="memory"):
        rt.create_sandbox(memory=0)
    with pytest.raises(TypeError):
        rt.create_sandbox(policy="allowlist")  # type: ignore[arg-type]


def test_duplicate_secret_names(rt: agenthold.Runtime) -> None:
    a = agenthold.Secret("k", "v1", hosts=["a.example.test"])
    b = agenthold.Secret("k", "v2", hosts=["b.example.test"])
    with pytest.raises(agenthold.SecretError, match="two secrets"):
        rt.create_sandbox(secrets=[a, b])


def test_secret_variable_also_in_env(rt: agenthold.Runtime) -> None:
    # The spec is at fault as much as the secret: SandboxError, as before the check moved into core.
    s = agenthold.Secret("k", "v", env="K", hosts=["a.example.test"])
    with pytest.raises(agenthold.SandboxError, match="set both in env"):
        rt.create_sandbox(env={"K": "x"}, secrets=[s])


def test_unknown_sandbox_id(rt: agenthold.Runtime) -> None:
    with pytest.raises(agenthold.SandboxError):
        rt.sandbox("nosuchsandbox0000").exec(["true"])
    with pytest.raises(agenthold.SandboxError, match="agent id"):
        rt.sandbox("../etc").exec(["true"])


def test_several_sandboxes_at_once(runtime_kwargs: dict, tmp_path: object) -> None:
    kwargs = dict(runtime_kwargs)
    kwargs["data_dir"] = str(tmp_path)  # its own runtime and gateway holder: a failure here stays here
    with agenthold.Runtime(**kwargs) as rt:
        made = []
        try:
            for i in range(3):
                made.append(rt.create_sandbox(env={"N": str(i)}))
            outs = [sb.exec(["sh", "-c", "echo $N"]).stdout for sb in made]
            assert outs == [b"0\n", b"1\n", b"2\n"]
        finally:
            for sb in made:
                sb.remove()


def _sandbox_agents(data_dir: str) -> list:
    """Agent ids of the sandbox containers a runtime on `data_dir` made (running or not), from Docker."""
    instance = hashlib.sha256(data_dir.encode()).hexdigest()[:12]
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=agenthold.instance={instance}",
         "--filter", "label=agenthold.role=sandbox", "--format", '{{.Label "agenthold.agent"}}'],
        check=True, capture_output=True, text=True,
    ).stdout
    return [line for line in out.split() if line]


# covers: P1, E8 (a pooled sandbox has no egress until handed out)
def test_warm_pool_hands_out_a_ready_sandbox(runtime_kwargs: dict, tmp_path: object, upstream: object) -> None:
    kwargs = dict(runtime_kwargs)
    kwargs["data_dir"] = str(tmp_path)
    with agenthold.Runtime(warm_pool=1, **kwargs) as rt:
        deadline = time.monotonic() + 90
        while rt.warm_pool_ready < 1:
            assert time.monotonic() < deadline, "the warm pool did not fill"
            time.sleep(0.2)
        [pooled] = _sandbox_agents(str(tmp_path))
        assert sb_denied_egress(rt, pooled), "a pooled sandbox has no egress before it is handed out"
        assert rt.sandboxes() == [], "pooled sandboxes are not listed"
        sb = rt.create_sandbox(policy=agenthold.Policy.allowlist([API]))
        try:
            assert sb.id == pooled, "a plain spec takes the ready sandbox"
            sb.write_file("/tmp/ca.pem", upstream.ca.read_text() + rt.ca_pem)  # type: ignore[attr-defined]
            ok = sb.exec(curl(f"https://{API}/pooled", "-o", "/dev/null", "-w", "%{http_code}"))
            assert ok.stdout == b"200", ok
            assert [s.id for s in rt.sandboxes()] == [sb.id]
        finally:
            sb.remove()
        assert rt.warm_pool_ready <= 1
    assert rt.warm_pool_ready == 0
    assert _sandbox_agents(str(tmp_path)) == [], "close() removes what is still pooled"


def sb_denied_egress(rt: agenthold.Runtime, agent: str) -> bool:
    """Whether plain HTTP to the allowed-later name fails from the pooled sandbox `agent`."""
    out = rt.sandbox(agent).exec(["curl", "-s", "-m", "5", "--noproxy", "*", "-o", "/dev/null", "-w",
                                  "%{http_code}", f"http://{API}/pooled-early"])
    return out.exit_code != 0 and out.stdout in (b"", b"000")
