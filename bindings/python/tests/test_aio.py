"""The asyncio API (`agenthold.aio`): the same operations as the blocking API, awaited."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Dict

import pytest

import agenthold
from conftest import API, OTHER, SECRET_VALUE, Upstream, curl


def test_aio_round_trip(runtime_kwargs: Dict[str, object], upstream: Upstream, tmp_path: object) -> None:
    kwargs = dict(runtime_kwargs)
    kwargs["data_dir"] = str(tmp_path)
    secret = agenthold.Secret("api", SECRET_VALUE, env="API_KEY", hosts=[API])

    async def main() -> None:
        async with agenthold.aio.Runtime(**kwargs) as rt:  # type: ignore[arg-type]
            async with await rt.create_sandbox(policy=agenthold.Policy.allowlist([API]), secrets=[secret],
                                               env={"HELLO": "world"}) as sb:
                assert isinstance(sb.id, str)
                assert sb in await rt.sandboxes()
                r = await sb.exec(["sh", "-c", "echo $HELLO $API_KEY"])
                assert r.exit_code == 0
                assert r.stdout.startswith(b"world agenthold-placeholder-")
                assert SECRET_VALUE.encode() not in r.stdout
                await sb.write_file("/tmp/ca.pem", upstream.ca.read_text() + rt.sync.ca_pem)
                assert (await sb.read_file("/tmp/ca.pem")).startswith(b"-----BEGIN")
                path = f"/aio-{uuid.uuid4().hex}"
                # Several commands at once on one event loop.
                results = await asyncio.gather(
                    sb.exec(curl(f"https://{API}{path}", "-o", "/dev/null", "-w", "%{http_code}")),
                    sb.exec(curl(f"https://{OTHER}/aio-denied")),
                    sb.exec(["sh", "-c", "sleep 0.5; echo slept"]),
                )
                assert results[0].stdout == b"200", results[0].stderr
                assert results[1].exit_code != 0
                assert results[2].stdout == b"slept\n"
                [seen] = upstream.seen(path)
                assert seen["headers"]["authorization"] == f"Bearer {SECRET_VALUE}"  # type: ignore[index]
                await sb.set_policy(agenthold.Policy.allowlist([OTHER]))
                assert (await sb.exec(curl(f"https://{OTHER}/aio-now-allowed"))).exit_code == 0
                log = await sb.request_log()
                assert any(e.path == path and e.secret_injected for e in log)
                await sb.stop()
                assert await sb.state() == "stopped"
                await sb.start()
                assert await sb.state() == "running"
                with pytest.raises(agenthold.SandboxError):
                    await sb.read_file("/nope")
                with pytest.raises(agenthold.SandboxError, match="build-dev"):
                    await rt.create_sandbox(image="agenthold/dev:missing")
            assert sb not in await rt.sandboxes()
        assert rt.closed

    asyncio.run(main())


def test_aio_cancel_kills_the_command(runtime_kwargs: Dict[str, object], tmp_path: object) -> None:
    kwargs = dict(runtime_kwargs)
    kwargs["data_dir"] = str(tmp_path)

    async def main() -> None:
        async with agenthold.aio.Runtime(**kwargs) as rt:  # type: ignore[arg-type]
            async with await rt.create_sandbox() as sb:
                t0 = time.monotonic()
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(sb.exec(["sleep", "30"]), timeout=1.0)
                assert time.monotonic() - t0 < 3
                # The kill runs in the background; it is done well within a couple of seconds.
                for _ in range(40):
                    left = (await sb.exec(["sh", "-c", "pgrep -x sleep || true"])).stdout
                    if not left:
                        break
                    await asyncio.sleep(0.1)
                assert left == b""
                # The loop stayed responsive while a command ran.
                ticks = 0

                async def tick() -> None:
                    nonlocal ticks
                    while True:
                        ticks += 1
                        await asyncio.sleep(0.01)

                ticker = asyncio.ensure_future(tick())
                await sb.exec(["sleep", "1"])
                ticker.cancel()
                assert ticks > 30

    asyncio.run(main())


def test_aio_needs_start() -> None:
    rt = agenthold.aio.Runtime()
    with pytest.raises(agenthold.SandboxError, match="not started"):
        rt.sync
    assert "not started" in repr(rt)
