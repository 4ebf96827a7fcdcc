"""Loopback HTTPS upstream for agenthold's interception tests (tests/integration/intercept).

Usage: python3 upstream.py CONFIG.json. The config names the certificate and key (PEM, from the test's
TestCa), the ALPN protocols to accept, a state directory (records.jsonl is appended there; the test
writes go-T-i files there) and optional parts: "expect" (the header and value that /quiet and /ws
check), "oauth" ("refresh": the refresh token the token endpoint accepts first; "echo_errors": name the
refused token in error answers) and "git_root" (bare repositories served under /org/ with git
http-backend, behind Basic auth with "git_user"/"git_token").

Routes (every request is recorded, with its headers, as one JSON line):
  /quiet...            answers {"authorized": bool} and never reflects anything of the request
  /sse?events=N&tag=T  server-sent events; after event i (i < N) waits for STATE/go-T-i
  /big?bytes=N         N bytes (Content-Length), generated on the fly
  /ws                  WebSocket (RFC 6455) echo of text frames; with ?reflect=H it first sends the value of
                       request header H back, split over fragments, with a ping and a close quoting it
  /reflect?h=H&form=F  an API that quotes request header H back (the E19 attack): F is raw, json, percent,
                       base64 or base64url (after &pre=P), header (in X-Echo and WWW-Authenticate), chunks
                       (the value cut in pieces, each flushed on its own), sse (cut across two writes of
                       one event) or gzip (compressed although asked for identity)
  /oauth/token         OAuth refresh (form or JSON): new tokens for the current refresh token
  /org/...             git smart HTTP (401 without the right Authorization)

Prints "PORT n" when it listens on 127.0.0.1:n.
"""

import base64
import hashlib
import json
import os
import secrets
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CFG = json.load(open(sys.argv[1]))
STATE = CFG["state"]
LOCK = threading.Lock()
OAUTH = {"refresh": (CFG.get("oauth") or {}).get("refresh"), "n": 1}
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def record(entry):
    entry["t"] = time.time()
    with LOCK, open(os.path.join(STATE, "records.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def rec(self, body=b"", **extra):
        record({
            "method": self.command,
            "path": self.path,
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
            "body": body.decode("utf-8", "replace"),
            "sni": getattr(self.connection, "agenthold_sni", None),
            "alpn": self.connection.selected_alpn_protocol(),
            **extra,
        })

    def reply(self, status, body, ctype="application/json", extra=()):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.route()

    def do_POST(self):
        self.route()

    def route(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path.startswith("/org/"):
            return self.git(url)
        if url.path == "/oauth/token":
            return self.token()
        if url.path.startswith("/quiet"):
            body = self.read_body()
            expect = CFG.get("expect") or {}
            ok = bool(expect) and self.headers.get(expect["header"]) == expect["value"]
            self.rec(body, authorized=ok)
            return self.reply(200, {"authorized": ok})
        if url.path == "/sse":
            return self.sse(int(query.get("events", "3")), query.get("tag", "sse"))
        if url.path == "/big":
            return self.big(int(query["bytes"]))
        if url.path == "/ws":
            return self.websocket(query.get("reflect"))
        if url.path == "/reflect":
            return self.reflect(query)
        self.rec(self.read_body())
        self.reply(404, {"error": "no such route"})

    def sse(self, events, tag):
        self.rec()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(1, events + 1):
            data = b"id: %d\ndata: event-%d\n\n" % (i, i)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            record({"sse_sent": i, "tag": tag})
            if i == events:
                break
            go = os.path.join(STATE, "go-%s-%d" % (tag, i))
            deadline = time.time() + 20
            while not os.path.exists(go) and time.time() < deadline:
                time.sleep(0.01)
            if not os.path.exists(go):
                record({"sse_timeout": i, "tag": tag})
                break
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        record({"sse_done": True, "tag": tag})

    def big(self, total):
        self.rec()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(total))
        self.end_headers()
        chunk = b"agenthold" * (1024 * 1024 // 9 + 1)
        chunk = chunk[: 1024 * 1024]
        sent = 0
        try:
            while sent < total:
                n = min(len(chunk), total - sent)
                self.wfile.write(chunk[:n] if n < len(chunk) else chunk)
                sent += n
        finally:
            record({"big_sent": sent})

    def reflect(self, q):
        self.rec(self.read_body())
        v = self.headers.get(q.get("h", "Authorization"), "")
        form = q.get("form", "raw")
        if form == "raw":
            return self.reply(401, ("invalid key: " + v).encode(), "text/plain")
        if form == "json":
            return self.reply(400, {"error": {"type": "invalid_request_error",
                                              "message": "Unexpected value(s) `%s` for the header" % v}})
        if form == "percent":
            return self.reply(200, ("next=/login%3Fkey%3D" + urllib.parse.quote(v, safe="")).encode(), "text/plain")
        if form in ("base64", "base64url"):
            enc = base64.b64encode if form == "base64" else base64.urlsafe_b64encode
            return self.reply(200, enc((q.get("pre", "") + v + "!").encode()), "text/plain")
        if form == "header":
            return self.reply(401, b"{}", extra=[("X-Echo", v),
                                                  ("WWW-Authenticate", 'Bearer error="invalid_token" t="%s"' % v)])
        if form in ("chunks", "sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if form == "sse" else "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            b = v.encode()
            pieces = [b"data: {\"echo\": \"" + b[:9], b[9:]] if form == "sse" else \
                [b"quote: " + b[:3]] + [b[i:i + 5] for i in range(3, len(b), 5)]
            pieces[-1] += b"\"}\n\n" if form == "sse" else b" end"
            for piece in pieces:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if form == "gzip":
            import gzip
            return self.reply(200, gzip.compress(("key " + v).encode()), "text/plain",
                              extra=[("Content-Encoding", "gzip")])
        return self.reply(400, {"error": "unknown form"})

    def ws_frame(self, opcode, data, fin=True):
        head = bytes([(0x80 if fin else 0) | opcode])
        if len(data) < 126:
            head += bytes([len(data)])
        else:
            head += bytes([126]) + struct.pack(">H", len(data))
        self.wfile.write(head + data)

    def websocket(self, reflect=None):
        key = self.headers.get("Sec-WebSocket-Key")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key:
            self.rec(upgrade=False)
            return self.reply(426, {"error": "websocket upgrade expected"})
        expect = CFG.get("expect") or {}
        ok = bool(expect) and self.headers.get(expect["header"]) == expect["value"]
        self.rec(upgrade=True, authorized=ok)
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        if reflect:
            v = self.headers.get(reflect, "").encode()
            self.ws_frame(1, b"you sent: " + v[:6], fin=False)
            self.wfile.flush()
            time.sleep(0.05)
            self.ws_frame(9, v)
            self.ws_frame(0, v[6:], fin=False)
            self.wfile.flush()
            time.sleep(0.05)
            self.ws_frame(0, b" (end)")
            self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            record({"ws_frame": opcode, "ws_text": data.decode("utf-8", "replace")})
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            reply = b"echo:" + data + (b" authorized" if ok else b" unauthorized")
            self.wfile.write(bytes([0x81, len(reply)]) + reply if len(reply) < 126 else
                             bytes([0x81, 126]) + struct.pack(">H", len(reply)) + reply)
            self.wfile.flush()

    def token(self):
        body = self.read_body()
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            form = json.loads(body or b"{}")
        else:
            form = dict(urllib.parse.parse_qsl(body.decode()))
        got = form.get("refresh_token")
        ok = self.command == "POST" and form.get("grant_type") == "refresh_token" and got == OAUTH["refresh"]
        self.rec(body, token_ok=ok, content_type=ctype)
        if not ok:
            error = {"error": "invalid_grant"}
            if (CFG.get("oauth") or {}).get("echo_errors"):
                # Some providers say which token they refused.
                error["error_description"] = "refresh token %s is invalid or expired" % got
            return self.reply(400, error)
        with LOCK:
            OAUTH["n"] += 1
            n = OAUTH["n"]
            access = "at-%d-%s" % (n, secrets.token_hex(12))
            OAUTH["refresh"] = "rt-%d-%s" % (n, secrets.token_hex(12))
            refresh = OAUTH["refresh"]
        record({"issued": {"access_token": access, "refresh_token": refresh}})
        self.reply(200, {"access_token": access, "refresh_token": refresh, "id_token": "id-not-a-secret",
                         "token_type": "Bearer", "expires_in": 3600})

    def git(self, url):
        body = self.read_body()
        want = "Basic " + base64.b64encode(("%s:%s" % (CFG["git_user"], CFG["git_token"])).encode()).decode()
        authorized = self.headers.get("Authorization") == want
        self.rec(b"", authorized=authorized)
        if not authorized:
            return self.reply(401, b"authentication required\n", "text/plain",
                              [("WWW-Authenticate", 'Basic realm="GitHub"')])
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": CFG["git_root"],
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": CFG["git_user"],
            "REMOTE_ADDR": "127.0.0.1",
        }
        for k, v in self.headers.items():
            env["HTTP_" + k.upper().replace("-", "_")] = v
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, payload = out.partition(sep)
        status, headers = 200, []
        for line in head.decode().splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        ctype = dict((k.lower(), v) for k, v in headers).get("content-type", "application/octet-stream")
        extra = [(k, v) for k, v in headers if k.lower() not in ("content-type", "content-length")]
        self.reply(status, payload, ctype, extra)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def finish_request(self, request, client_address):
        # TLS per connection thread: a slow handshake must not block accept().
        request.settimeout(30)
        try:
            tls = CONTEXT.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            record({"tls_error": str(e)})
            return
        if tls.selected_alpn_protocol() == "h2":
            # An HTTP/1.1-only application: record what arrives (an h2 preface) and hang up.
            try:
                first = tls.recv(64)
            except OSError:
                first = b""
            record({"h2_connection": True, "first_bytes": first.decode("latin-1")})
            tls.close()
            return
        self.RequestHandlerClass(tls, client_address, self)


def sni(sock, name, _ctx):
    sock.agenthold_sni = name


CONTEXT = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
CONTEXT.load_cert_chain(CFG["cert"], CFG["key"])
CONTEXT.set_alpn_protocols(CFG.get("alpn") or ["http/1.1"])
CONTEXT.sni_callback = sni

server = Server(("127.0.0.1", 0), Handler)
print("PORT %d" % server.server_address[1], flush=True)
server.serve_forever()
