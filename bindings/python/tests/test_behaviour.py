"""Process-level behaviour: Ctrl-C interrupts exec and kills the command, the GIL is released while calls
wait, and no thread outlives close()."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Dict, Iterator

import pytest

import agenthold


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """Python's own SIGINT handler (KeyboardInterrupt), as in an interactive program, even when the test
    process inherited SIGINT ignored (a background job of a non-interactive shell)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def sleeps(sb: agenthold.Sandbox) -> bytes:
    return sb.exec(["sh", "-c", "pgrep -x sleep || true"]).stdout.strip()


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_interrupts_exec_and_kills_the_command(shared_sandbox: agenthold.Sandbox) -> None:
    assert threading.current_thread() is threading.main_thread()
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            shared_sandbox.exec(["sleep", "30"])
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 1.0 + 2.0
    assert sleeps(shared_sandbox) == b""


@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_interrupts_exec_stream(shared_sandbox: agenthold.Sandbox) -> None:
    stream = shared_sandbox.exec_stream(["sh", "-c", "echo begin; sleep 30"])
    assert next(stream) == ("stdout", b"begin\n")
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in stream:
                pass
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 0.5 + 2.0
    assert sleeps(shared_sandbox) == b""


def test_gil_is_released_during_exec(shared_sandbox: agenthold.Sandbox) -> None:
    count = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = count
        time.sleep(0.2)
        baseline = count - before
        start = count
        shared_sandbox.exec(["sleep", "1.5"])
        during = count - start
    finally:
        stop.set()
        t.join()
    # While exec waits, the other thread keeps the interpreter: it counts at least as fast as it did
    # while this thread slept for 0.2 s (1.5 s of it, minus slack).
    assert during > baseline * 2, (baseline, during)


def test_calls_from_several_threads(shared_sandbox: agenthold.Sandbox) -> None:
    results: Dict[int, bytes] = {}

    def run(i: int) -> None:
        results[i] = shared_sandbox.exec(["sh", "-c", f"sleep 0.5; echo {i}"]).stdout

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i}\n".encode() for i in range(4)}
    assert time.monotonic() - t0 < 4 * 0.5 + 3  # they overlapped


CHILD = textwrap.dedent(
    """
    import json, os, sys, threading, asyncio, time
    import agenthold

    def native_threads():
        return sorted(os.listdir("/proc/self/task"))

    def settled(want):
        # A joined thread's kernel task can still be listed for a moment: Python's join returns when the
        # thread's Python state is gone, before the OS thread has finished exiting. Wait (bounded) for the
        # list to settle; whatever is still there after 5 s did outlive close, and its name says whose it is.
        deadline = time.monotonic() + 5
        while True:
            now = native_threads()
            if now == want or time.monotonic() > deadline:
                return [t if t in want else t + ":" + comm(t) for t in now]
            time.sleep(0.02)

    def comm(tid):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                return f.read().strip()
        except OSError:
            return "gone"

    kwargs = json.loads(sys.argv[1])
    before_tasks, before_py = native_threads(), [t.name for t in threading.enumerate()]
    rt = agenthold.Runtime(**kwargs)
    sb = rt.create_sandbox()
    out = sb.exec(["echo", "hi"]).stdout
    during = len(native_threads())
    sb.remove()
    rt.close()
    after_tasks, after_py = settled(before_tasks), [t.name for t in threading.enumerate()]

    async def aio():
        async with agenthold.aio.Runtime(**kwargs) as art:
            s = await art.create_sandbox()
            try:
                return (await s.exec(["echo", "async"])).stdout
            finally:
                await s.remove()
    aout = asyncio.run(aio())
    after_aio = settled(before_tasks)
    print(json.dumps(dict(out=out.decode(), aout=aout.decode(), before=before_tasks, during=during,
                          after=after_tasks, after_aio=after_aio, before_py=before_py, after_py=after_py,
                          after_aio_py=[t.name for t in threading.enumerate()])))
    """
)


def test_no_thread_outlives_close(runtime_kwargs: Dict[str, object], tmp_path: object) -> None:
    kwargs = dict(runtime_kwargs)
    kwargs["data_dir"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(kwargs)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["out"] == "hi\n" and got["aout"] == "async\n"
    assert got["during"] > len(got["before"])  # the runtime did start threads
    assert got["after"] == got["before"], got
    assert got["after_aio"] == got["before"], got
    assert got["after_py"] == got["before_py"] == got["after_aio_py"] == ["MainThread"]


def test_closed_runtime_refuses_calls(runtime_kwargs: Dict[str, object], tmp_path: object) -> None:
    kwargs = dict(runtime_kwargs)
    kwargs["data_dir"] = str(tmp_path)
    with agenthold.Runtime(**kwargs) as rt:  # type: ignore[arg-type]
        sb = rt.create_sandbox()
    assert rt.closed
    rt.close()  # idempotent
    with pytest.raises(agenthold.SandboxError, match="closed"):
        sb.exec(["true"])
    with pytest.raises(agenthold.SandboxError, match="closed"):
        rt.create_sandbox()
    # A new runtime on the same data directory takes the sandbox over.
    with agenthold.Runtime(**kwargs) as rt2:  # type: ignore[arg-type]
        again = rt2.sandbox(sb.id)
        assert again in rt2.sandboxes()
        assert again.exec(["echo", "back"]).stdout == b"back\n"
        again.remove()
