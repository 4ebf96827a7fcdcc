"""Fixtures: a local HTTPS/HTTP echo upstream with a throwaway CA (openssl), a loopback DNS responder that
answers NXDOMAIN and records every name it is asked, and one agenthold runtime wired to both with the
test-only `dangerous_*` options. Nothing leaves this machine: every name the sandboxes use is mapped to
loopback, and the DNS upstream is ours."""

from __future__ import annotations

import http.server
import json
import os
import socket
import ssl
import struct
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

import agenthold

# Names the gateway maps to the local upstream (the certificate covers them).
API = "api.example.test"
OTHER = "other.example.test"
# Allowed in some tests but mapped to nothing: its DNS query reaches our responder (NXDOMAIN).
UNMAPPED = "unmapped.example.test"
SECRET_VALUE = "sk-test-" + uuid.uuid4().hex


class Upstream:
    """HTTPS and HTTP servers on 127.0.0.1 that answer every request with a JSON echo of it and keep a
    record of what they received."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.ca = workdir / "ca.pem"
        self._make_certs()
        self.requests: List[Dict[str, object]] = []
        self._lock = threading.Lock()
        self._servers: List[http.server.ThreadingHTTPServer] = []
        self.https_port = self._serve(tls=True)
        self.http_port = self._serve(tls=False)

    def _make_certs(self) -> None:
        d = self.dir

        def run(*args: str) -> None:
            subprocess.run(args, check=True, capture_output=True)

        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(d / "ca.key"), "-out", str(self.ca), "-days", "2", "-subj", "/CN=agenthold pytest CA")
        run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(d / "srv.key"), "-out", str(d / "srv.csr"), "-subj", f"/CN={API}")
        (d / "ext.cnf").write_text(f"subjectAltName=DNS:{API},DNS:{OTHER},DNS:*.example.test\n")
        run("openssl", "x509", "-req", "-in", str(d / "srv.csr"), "-CA", str(self.ca), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-out", str(d / "srv.pem"), "-days", "2", "-extfile", str(d / "ext.cnf"))

    def _serve(self, tls: bool) -> int:
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_any(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                rec = {
                    "scheme": "https" if tls else "http",
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body.decode("latin-1"),
                }
                with upstream._lock:
                    upstream.requests.append(rec)
                # The request comes back whole, as an echo API would send it (E19: the gateway scrubs it).
                out = json.dumps({"upstream": "upstream-ok", "path": self.path, "headers": rec["headers"]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = handle_any

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(self.dir / "srv.pem"), str(self.dir / "srv.key"))
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name="test-upstream", daemon=True).start()
        self._servers.append(server)
        return int(server.server_address[1])

    def seen(self, path: str) -> List[Dict[str, object]]:
        """Requests received for `path` (without the query string)."""
        with self._lock:
            return [r for r in self.requests if str(r["path"]).split("?")[0] == path]

    def close(self) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()


class DnsResponder:
    """A UDP DNS server on 127.0.0.1 that answers NXDOMAIN to everything and records the names asked."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.names: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-dns", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            if len(query) < 12:
                continue
            labels, i = [], 12
            while i < len(query) and query[i] != 0:
                n = query[i]
                labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace"))
                i += 1 + n
            question_end = i + 5  # the root label, QTYPE, QCLASS
            self.names.append(".".join(labels).lower())
            (qid,) = struct.unpack("!H", query[:2])
            # QR, opcode 0, RD copied, RA, RCODE 3 (NXDOMAIN); one question, no answers.
            flags = 0x8000 | (query[2] & 0x01) << 8 | 0x0080 | 3
            header = struct.pack("!HHHHHH", qid, flags, 1, 0, 0, 0)
            try:
                self.sock.sendto(header + query[12:question_end], peer)
            except OSError:
                pass

    def asked(self, name: str) -> bool:
        """Whether the responder was asked for `name` (or a name under it)."""
        return any(n == name or n.endswith("." + name) or n.startswith(name + ".") for n in list(self.names))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    u = Upstream(tmp_path_factory.mktemp("upstream"))
    yield u
    u.close()


@pytest.fixture(scope="session")
def dns() -> Iterator[DnsResponder]:
    d = DnsResponder()
    yield d
    d.close()


@pytest.fixture(scope="session")
def runtime_kwargs(upstream: Upstream, dns: DnsResponder, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, object]:
    """Arguments for an `agenthold.Runtime` wired to the local upstream and DNS responder."""
    return dict(
        data_dir=str(tmp_path_factory.mktemp("agenthold-data")),
        dns_upstream=dns.addr,
        dangerous_connect_to={
            f"{API}:443": f"127.0.0.1:{upstream.https_port}",
            f"{API}:80": f"127.0.0.1:{upstream.http_port}",
            f"{OTHER}:443": f"127.0.0.1:{upstream.https_port}",
        },
        dangerous_upstream_ca=str(upstream.ca),
    )


@pytest.fixture(scope="session")
def rt(runtime_kwargs: Dict[str, object]) -> Iterator[agenthold.Runtime]:
    with agenthold.Runtime(**runtime_kwargs) as runtime:  # type: ignore[arg-type]
        yield runtime
        for sb in runtime.sandboxes():  # whatever a failed test left behind
            sb.remove()


@pytest.fixture
def make_sandbox(rt: agenthold.Runtime, upstream: Upstream) -> Iterator[object]:
    """Create sandboxes that are removed after the test; each gets /tmp/ca.pem trusting the test upstream's
    CA and the runtime's (for intercepted hosts)."""
    made: List[agenthold.Sandbox] = []

    def make(**kwargs: object) -> agenthold.Sandbox:
        sb = rt.create_sandbox(**kwargs)  # type: ignore[arg-type]
        made.append(sb)
        sb.write_file("/tmp/ca.pem", upstream.ca.read_text() + rt.ca_pem)
        return sb

    yield make
    for sb in made:
        sb.remove()


@pytest.fixture
def shared_sandbox(rt: agenthold.Runtime) -> Iterator[agenthold.Sandbox]:
    """An open-policy sandbox with SHARED=yes in its environment. Tests keep to one sandbox at a time per
    runtime: with several at once, joining the gateway to a new network fails now and then (reported)."""
    sb = rt.create_sandbox(env={"SHARED": "yes"})
    yield sb
    sb.remove()


def curl(url: str, *args: str, proxy: bool = False) -> List[str]:
    """argv for curl in a sandbox: quiet, 10 s, test CAs trusted, transparent path unless `proxy`."""
    argv = ["curl", "-sS", "-m", "10", "--cacert", "/tmp/ca.pem"]
    if not proxy:
        argv += ["--noproxy", "*"]
    return argv + list(args) + [url]


@pytest.fixture(scope="session", autouse=True)
def _docker_ready() -> None:
    """Fail early, clearly, when the engine or the dev image is missing."""
    if not os.path.exists("/var/run/docker.sock"):
        pytest.fail("Docker is not running (no /var/run/docker.sock): these tests need the engine")
