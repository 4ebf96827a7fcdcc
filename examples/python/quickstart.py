#!/usr/bin/env python3
"""agenthold from Python: embed a runtime, create a sandbox with an allowlist and a secret, run a command in
it against a local upstream, change the policy live, and print the request log.

The upstream is an HTTPS server on this machine's loopback standing in for ``api.example.com`` (its
certificate comes from a throwaway CA made with ``openssl``). The gateway never dials loopback, so the
example maps the name to it with the test-only ``dangerous_connect_to`` option and trusts the throwaway CA
with ``dangerous_upstream_ca``. Against real hosts you would drop both.

Run as root with Docker and the dev image (``agenthold image build-dev``):
    python3 examples/python/quickstart.py
"""

from __future__ import annotations

import http.server
import json
import os
import ssl
import subprocess
import tempfile
import threading

import agenthold

HOST = "api.example.com"


def start_upstream(workdir: str) -> tuple[int, str, list[dict[str, str]]]:
    """An HTTPS server on 127.0.0.1 that records each request's headers; returns (port, CA path, record)."""
    ca, ca_key = os.path.join(workdir, "ca.pem"), os.path.join(workdir, "ca.key")
    crt, key, csr = (os.path.join(workdir, n) for n in ("srv.pem", "srv.key", "srv.csr"))
    ext = os.path.join(workdir, "ext.cnf")
    with open(ext, "w") as f:
        f.write(f"subjectAltName=DNS:{HOST}\n")
    for argv in (
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", ca_key,
         "-out", ca, "-days", "1", "-subj", "/CN=quickstart CA"],
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
         "-subj", f"/CN={HOST}"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", crt, "-days", "1",
         "-extfile", ext],
    ):
        subprocess.run(["openssl", *argv], check=True, capture_output=True)
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = json.dumps({"path": self.path, "got_authorization": "authorization" in seen[-1]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1], ca, seen


def main() -> None:
    workdir = tempfile.mkdtemp(prefix="agenthold-quickstart-")
    port, upstream_ca, seen = start_upstream(workdir)
    data_dir = os.environ.get("AGENTHOLD_DATA_DIR", "/tmp/agenthold-quickstart-py")

    api_key = agenthold.Secret("api-key", "sk-quickstart-real-value", env="API_KEY", hosts=[HOST],
                               header="Authorization", template="Bearer {{.Value}}")
    print(f"secret: {api_key!r}")  # the value is never shown

    with agenthold.Runtime(
        data_dir=data_dir,
        dangerous_connect_to={f"{HOST}:443": f"127.0.0.1:{port}"},
        dangerous_upstream_ca=upstream_ca,
    ) as rt:
        print(f"runtime ready (data dir {rt.data_dir})")
        with rt.create_sandbox(policy=agenthold.Policy.allowlist([HOST]), secrets=[api_key]) as sb:
            print(f"sandbox {sb.id} created")
            script = (
                'echo "inside, API_KEY=$API_KEY"; '
                f"curl -sS https://{HOST}/v1/hello; echo; "
                f"curl -sS -m 5 https://example.org/ || echo 'example.org: refused (not on the allowlist)'"
            )
            out = sb.exec(["sh", "-c", script], timeout=60)
            print(f"--- command output (exit {out.exit_code}) ---\n{out.stdout.decode()}", end="")
            if seen:
                print(f"--- the upstream received Authorization: {seen[-1].get('authorization')!r}")

            sb.set_policy(agenthold.Policy.allowlist(["example.org"]))
            again = sb.exec(["curl", "-sS", "-m", "5", f"https://{HOST}/v1/again"])
            print(f"--- after set_policy, {HOST}: exit {again.exit_code} (refused)")

            print("--- request log ---")
            for e in sb.request_log():
                print(json.dumps(e.to_dict()))
        print("sandbox removed")


if __name__ == "__main__":
    main()
