"""`agenthold.Client` against a loopback stub of the server's HTTP API: the wire shapes of the calls whose
endpoints are still being built (execs, request log, files), timeouts, cancellation, and what the client
does with answers a healthy server seldom gives (redirects, 429, non-JSON errors). No Docker needed."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterator, List, Optional

import pytest

import agenthold

TOKEN = "ahp_stub_" + "k" * 32
BASE = "/api/v1/workspaces/w/agents/a"


class Stub:
    """A ThreadingHTTPServer that answers like the server would; `mode` switches /api/v1/me's answer."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.files: Dict[str, bytes] = {}
        self.seen: List[Dict[str, Any]] = []
        self.release = threading.Event()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self, status: int, body: Any, ctype: str = "application/json",
                       headers: Optional[Dict[str, str]] = None) -> None:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def handle_any(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                stub.seen.append({"method": self.command, "path": url.path, "query": query, "body": body,
                                  "headers": {k.lower(): v for k, v in self.headers.items()}})
                route = (self.command, url.path)
                if route == ("GET", "/api/v1/me"):
                    if stub.mode == "hang":
                        stub.release.wait(10)
                        return self.answer(200, {"id": "late"})
                    if stub.mode == "redirect":
                        return self.answer(302, b"", "text/plain", {"location": "http://elsewhere.test/api/v1/me"})
                    if stub.mode == "busy":
                        return self.answer(429, {"status": 429, "code": "rate_limited", "detail": "slow down"},
                                           "application/problem+json", {"retry-after": "3"})
                    if stub.mode == "text":
                        return self.answer(502, b"bad gateway from a proxy", "text/plain")
                    return self.answer(200, {"id": "u", "name": "stub", "workspaces": [{"id": "w"}]})
                if route == ("POST", f"{BASE}/execs"):
                    return self.answer(200, {
                        "id": "e1", "exit_code": 3, "stdout": "\ufffd\x00", "stderr": "err",
                        "stdout_b64": base64.b64encode(b"\xff\x00").decode(),
                        "stderr_b64": base64.b64encode(b"err").decode(),
                    })
                if route == ("GET", f"{BASE}/requests"):
                    if query.get("cursor") == "c1":
                        return self.answer(200, {"items": [{"seq": 1, "host": "a"}], "next_cursor": None})
                    return self.answer(200, {"items": [{"seq": 3, "host": "c"}, {"seq": 2, "host": "b"}],
                                             "next_cursor": "c1"})
                if route == ("PUT", f"{BASE}/files/content"):
                    stub.files[query["path"]] = body
                    return self.answer(204, b"", "text/plain")
                if route == ("GET", f"{BASE}/files/content"):
                    if query["path"] not in stub.files:
                        return self.answer(404, {"status": 404, "code": "not_found", "detail": "no such resource"},
                                           "application/problem+json")
                    return self.answer(200, stub.files[query["path"]], "application/octet-stream")
                if route == ("GET", f"{BASE}/files"):
                    return self.answer(200, {"items": [{"name": p.rsplit("/", 1)[-1]} for p in stub.files]})
                if route == ("DELETE", f"{BASE}/files"):
                    stub.files.pop(query["path"], None)
                    return self.answer(204, b"", "text/plain")
                return self.answer(404, {"status": 404, "code": "not_found", "detail": "no such resource"},
                                   "application/problem+json")

            do_GET = do_POST = do_PUT = do_DELETE = handle_any

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-stub", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


def sandbox(stub: Stub, **kwargs: Any) -> agenthold.RemoteSandbox:
    return agenthold.Client(stub.url, TOKEN, **kwargs).sandbox("a", "w")


def test_exec_wire_shape(stub: Stub) -> None:
    r = sandbox(stub).exec(["sh", "-c", "x"], timeout=5, env={"A": "1"}, cwd="/tmp")
    sandbox(stub).exec(["true"], timeout=0.5)
    assert (r.exit_code, r.stdout, r.stderr, r.ok, r.timed_out, r.id) == (3, b"\xff\x00", b"err", False, False, "e1")
    assert "stdout=<2 bytes>" in repr(r)
    req, fraction = stub.seen
    assert json.loads(req["body"]) == {"argv": ["sh", "-c", "x"], "timeout": 5, "env": {"A": "1"}, "cwd": "/tmp"}
    assert b'"timeout": 5,' in req["body"] and json.loads(fraction["body"])["timeout"] == 0.5
    assert req["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert req["headers"]["accept"] == "application/json"
    # Without the base64 fields, the text ones.
    text = agenthold.RemoteExecResult.from_json({"exit_code": 0, "stdout": "hé", "stderr": ""})
    assert text.stdout == "hé".encode() and text.ok


def test_request_log_follows_cursors_oldest_first(stub: Stub) -> None:
    log = sandbox(stub).request_log()
    assert [e["host"] for e in log] == ["a", "b", "c"]
    assert [r["query"].get("cursor") for r in stub.seen] == [None, "c1"]


def test_files_wire_shape(stub: Stub) -> None:
    sb = sandbox(stub)
    data = bytes(range(256))
    sb.write_file("/tmp/a b&c.bin", data)
    put = stub.seen[-1]
    assert put["query"] == {"path": "/tmp/a b&c.bin"} and put["body"] == data
    assert put["headers"]["content-type"] == "application/octet-stream"
    assert sb.read_file("/tmp/a b&c.bin") == data
    assert sb.list_files("/tmp") == [{"name": "a b&c.bin"}]
    sb.delete_file("/tmp/a b&c.bin")
    with pytest.raises(agenthold.SandboxError) as e:
        sb.read_file("/tmp/a b&c.bin")
    assert (e.value.status, e.value.code) == (404, "not_found")  # type: ignore[attr-defined]


def test_unusual_answers(stub: Stub) -> None:
    client = agenthold.Client(stub.url, TOKEN)
    stub.mode = "redirect"
    with pytest.raises(agenthold.RemoteError) as e:
        client.me()
    assert e.value.status == 302 and "not followed" in e.value.detail
    assert len([r for r in stub.seen if r["path"] == "/api/v1/me"]) == 1
    stub.mode = "busy"
    with pytest.raises(agenthold.RemoteError) as e:
        client.me()
    assert (e.value.status, e.value.code, e.value.retry_after) == (429, "rate_limited", 3.0)
    assert not isinstance(e.value, agenthold.SandboxError)
    stub.mode = "text"
    with pytest.raises(agenthold.EngineError) as e2:
        client.me()
    assert e2.value.status == 502 and "bad gateway from a proxy" in e2.value.detail  # type: ignore[attr-defined]
    for err in (e.value, e2.value):
        assert TOKEN not in str(err) and TOKEN not in repr(err) and TOKEN not in repr(vars(err))


def test_every_request_has_a_timeout(stub: Stub) -> None:
    stub.mode = "hang"
    started = time.monotonic()
    with pytest.raises(agenthold.EngineError) as e:
        agenthold.Client(stub.url, TOKEN, timeout=0.5).me()
    assert time.monotonic() - started < 5
    assert isinstance(e.value, agenthold.RemoteError) and e.value.code == "timeout" and e.value.status is None


def test_the_default_workspace_is_the_only_one(stub: Stub) -> None:
    client = agenthold.Client(stub.url, TOKEN)
    assert client.workspace is None
    assert client.sandbox("a").request_log()
    assert client.workspace == "w"


def test_aio_cancel_ends_the_call_and_its_thread(stub: Stub) -> None:
    stub.mode = "hang"

    async def main() -> float:
        rt = agenthold.aio.Client(stub.url, TOKEN, timeout=20)
        task = asyncio.ensure_future(rt.me())
        await asyncio.sleep(0.3)
        assert [t for t in threading.enumerate() if t.name == "agenthold-aio-client"]
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    took = asyncio.run(main())
    assert took < 2, f"cancelling took {took:.1f} s"
    assert [t for t in threading.enumerate() if t.name == "agenthold-aio-client"] == []
