# The sandbox-side client of the gateway tests: `python3 -c SCRIPT MODE ARGS...` inside a sandbox
# namespace. Every mode prints one JSON object on its last line (interactive modes print one per step).
# Only the standard library: the point is to act like an ordinary program in a sandbox, with raw control
# over the bytes where curl would normalise them.
import json, random, select, socket, ssl, struct, sys, time


def out(obj):
    print(json.dumps(obj), flush=True)


def err(e):
    return {"error": type(e).__name__ + ": " + str(e)}


# --- DNS ------------------------------------------------------------------------------------------------

QTYPES = {"A": 1, "AAAA": 28, "TXT": 16, "PTR": 12, "SOA": 6}


def dns_packet(name, qtype):
    qid = random.randrange(65536)
    qname = b"".join(bytes([len(l)]) + l.encode() for l in name.rstrip(".").split(".")) + b"\0"
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    return qid, header + qname + struct.pack("!HH", QTYPES[qtype], 1)


def skip_name(msg, i):
    while True:
        n = msg[i]
        if n == 0:
            return i + 1
        if n & 0xC0 == 0xC0:
            return i + 2
        i += 1 + n


def dns_parse(msg, qid):
    rid, flags, qd, an, _, _ = struct.unpack("!HHHHHH", msg[:12])
    i = 12
    for _ in range(qd):
        i = skip_name(msg, i) + 4
    addrs = []
    for _ in range(an):
        i = skip_name(msg, i)
        rtype, _, _, rdlen = struct.unpack("!HHIH", msg[i : i + 10])
        i += 10
        rdata = msg[i : i + rdlen]
        i += rdlen
        if rtype == 1:
            addrs.append(socket.inet_ntoa(rdata))
        elif rtype == 28:
            addrs.append(socket.inet_ntop(socket.AF_INET6, rdata))
    return {"rcode": flags & 0xF, "answers": an, "addrs": addrs, "id_ok": rid == qid}


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def dns(server, name, qtype="A", transport="udp", timeout=2.0):
    qid, pkt = dns_packet(name, qtype)
    try:
        if transport == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(timeout)
            s.connect((server, 53))
            s.send(pkt)
            msg = s.recv(4096)
        else:
            s = socket.create_connection((server, 53), timeout=timeout)
            s.sendall(struct.pack("!H", len(pkt)) + pkt)
            msg = recv_exact(s, struct.unpack("!H", recv_exact(s, 2))[0])
        s.close()
    except socket.timeout:
        return {"error": "timeout"}
    except OSError as e:
        return err(e)
    return dns_parse(msg, qid)


# --- HTTP over any stream ---------------------------------------------------------------------------------


def read_response(f):
    line = f.readline()
    if not line:
        return {"error": "closed"}
    status = int(line.split(b" ", 2)[1])
    headers = {}
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, v = h.decode("latin-1").split(":", 1)
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = f.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int(f.readline().split(b";")[0], 16)
            if size == 0:
                f.readline()
                break
            body += f.read(size)
            f.readline()
    elif headers.get("connection", "").lower() == "close":
        body = f.read()
    else:
        body = b""
    return {"status": status, "headers": headers, "body": body.decode("utf-8", "replace")}


def request_text(method, target, host, body=b"", extra=""):
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}"
    if body or method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def tls_wrap(sock, sni, cafile):
    if cafile == "-":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx.wrap_socket(sock, server_hostname=sni)


def proxy_connect(sock, authority):
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    f = sock.makefile("rb")
    line = f.readline()
    status = int(line.split(b" ", 2)[1]) if line else 0
    headers = {}
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, v = h.decode("latin-1").split(":", 1)
        headers[k.strip().lower()] = v.strip()
    body = b""
    if status != 200 and "content-length" in headers:
        body = f.read(int(headers["content-length"]))
    return status, body.decode("utf-8", "replace")


def open_tls(addr, port, sni, cafile, proxy=None, timeout=5.0):
    """A TLS connection to addr:port with SNI `sni`, directly or through a CONNECT proxy ("ip:port")."""
    if proxy:
        phost, pport = proxy.rsplit(":", 1)
        s = socket.create_connection((phost, int(pport)), timeout=timeout)
        status, body = proxy_connect(s, f"{addr}:{port}")
        if status != 200:
            raise ConnectionError(f"CONNECT answered {status}: {body}")
    else:
        s = socket.create_connection((addr, port), timeout=timeout)
    return tls_wrap(s, sni, cafile)


def cert_names(t):
    cert = t.getpeercert()
    if not cert:
        return {}
    name = lambda rdns: ",".join(f"{k}={v}" for rdn in rdns for (k, v) in rdn)
    return {"issuer": name(cert["issuer"]), "subject": name(cert["subject"])}


def https(addr, port, sni, cafile, path="/", host=None, proxy=None):
    """One GET over TLS: status, body, the certificate's issuer and subject."""
    try:
        t = open_tls(addr, int(port), sni, cafile, proxy)
        names = cert_names(t)
        t.sendall(request_text("GET", path, host or sni, extra="Connection: close\r\n"))
        r = read_response(t.makefile("rb"))
        r.update(names)
        return r
    except (OSError, ssl.SSLError) as e:
        return err(e)


def session(addr, port, requests, pipelined=False):
    """Several HTTP requests on ONE TCP connection, one after the other or all in one write."""
    results = []
    try:
        s = socket.create_connection((addr, int(port)), timeout=5)
        f = s.makefile("rb")
        if pipelined:
            s.sendall("".join(requests).encode())
            for _ in requests:
                results.append(read_response(f))
        else:
            for r in requests:
                try:
                    s.sendall(r.encode())
                    results.append(read_response(f))
                except (OSError, ValueError) as e:
                    results.append(err(e))
    except (OSError, ValueError) as e:
        results.append(err(e))
    return results


# --- Raw bytes --------------------------------------------------------------------------------------------


def client_hello(sni, ech=False):
    """A minimal TLS 1.2 ClientHello carrying `sni` verbatim (whatever it is, an address included), with an
    Encrypted Client Hello extension (0xfe0d, an opaque payload) when `ech`."""
    name = sni.encode()
    sni_ext = struct.pack("!HHHBH", 0, len(name) + 5, len(name) + 3, 0, len(name)) + name
    if ech:
        sni_ext += struct.pack("!HH", 0xFE0D, 8) + bytes(8)
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x04\x13\x01\xc0\x2f" + b"\x01\x00"
    body += struct.pack("!H", len(sni_ext)) + sni_ext
    handshake = b"\x01" + struct.pack("!I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def wait_closed(s, limit):
    """Seconds until the peer closes (or resets) `s`, None if still open after `limit` s; bytes received."""
    start = time.monotonic()
    got = b""
    while time.monotonic() - start < limit:
        r, _, _ = select.select([s], [], [], max(0.0, limit - (time.monotonic() - start)))
        if not r:
            break
        try:
            chunk = s.recv(65536)
        except OSError:
            return time.monotonic() - start, got
        if not chunk:
            return time.monotonic() - start, got
        got += chunk
    return None, got


def hellos(addr, port, snis):
    """One connection per SNI: send a ClientHello, report whether anything came back before the close."""
    results = {}
    for sni in snis:
        try:
            s = socket.create_connection((addr, int(port)), timeout=3)
            s.sendall(client_hello(sni))
            closed, got = wait_closed(s, 3.0)
            results[sni] = {"closed_after": closed, "received": len(got)}
            s.close()
        except OSError as e:
            results[sni] = err(e)
    return results


def split_hello(addr, port, sni, how):
    """A ClientHello for `sni` split the way a sniffer might not expect: over two TLS records ("records"),
    or one byte per TCP segment ("bytes"). Reports whether the gateway closed without answering."""
    hello = client_hello(sni)
    if how == "records":
        handshake = hello[5:]
        cut = 7  # inside the handshake header: neither record holds the whole ClientHello, nor the SNI
        data = b"".join(
            b"\x16\x03\x01" + struct.pack("!H", len(part)) + part for part in (handshake[:cut], handshake[cut:])
        )
    else:
        data = hello
    try:
        s = socket.create_connection((addr, int(port)), timeout=3)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if how == "bytes":
            for b in data:
                s.send(bytes([b]))
                time.sleep(0.002)
        else:
            s.sendall(data)
        closed, got = wait_closed(s, 3.0)
        return {"closed_after": closed, "received": len(got)}
    except OSError as e:
        return err(e)


def steps(addr, port):
    """One TCP connection; each line on stdin is a JSON string sent as a request; each answer printed."""
    s = socket.create_connection((addr, int(port)), timeout=5)
    f = s.makefile("rb")
    out({"ready": True})
    for line in sys.stdin:
        try:
            s.sendall(json.loads(line).encode())
            out(read_response(f))
        except (OSError, ValueError) as e:
            out(err(e))


def raw(addr, port, send_hex, wait_first, expect, limit=3.0):
    """Raw TCP: optionally wait for the server to speak first, send bytes, read until `expect` bytes arrived
    or the connection closed or `limit` passed."""
    limit = float(limit)
    try:
        s = socket.create_connection((addr, int(port)), timeout=limit)
        got = b""
        t0 = time.monotonic()
        if wait_first == "wait":
            got += s.recv(65536)
        s.sendall(bytes.fromhex(send_hex))
        closed = False
        s.settimeout(0.3)
        while len(got) < int(expect) and time.monotonic() - t0 < limit:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                closed = True
                break
            got += chunk
        s.close()
        return {"received": got.decode("latin-1"), "closed": closed}
    except OSError as e:
        return err(e)


def cut(addr, port, prefix_hex, drip_hex, interval, limit):
    """Connect, send `prefix`, then one byte of `drip` every `interval` s; report when the peer closed."""
    try:
        s = socket.create_connection((addr, int(port)), timeout=3)
    except OSError as e:
        return err(e)
    t0 = time.monotonic()
    if prefix_hex.startswith("hello:"):
        # hello:NAME:N — the first N bytes of a ClientHello for NAME.
        _, name, n = prefix_hex.split(":")
        s.sendall(client_hello(name)[: int(n)])
    else:
        s.sendall(bytes.fromhex(prefix_hex))
    drip = bytes.fromhex(drip_hex)
    interval, limit = float(interval), float(limit)
    got = b""
    sent = 0
    while time.monotonic() - t0 < limit:
        r, _, _ = select.select([s], [], [], interval)
        if r:
            try:
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                return {"closed_after": time.monotonic() - t0, "received": got.decode("latin-1"), "sent": sent}
            got += chunk
        elif sent < len(drip):
            try:
                s.send(drip[sent : sent + 1])
                sent += 1
            except OSError:
                return {"closed_after": time.monotonic() - t0, "received": got.decode("latin-1"), "sent": sent}
    return {"closed_after": None, "received": got.decode("latin-1"), "sent": sent}


def payload(spec):
    """Bytes to send: hex, or hello:NAME for a ClientHello naming NAME."""
    if spec.startswith("hello:"):
        return client_hello(spec.split(":", 1)[1])
    if spec.startswith("ech-hello:"):
        return client_hello(spec.split(":", 1)[1], ech=True)
    return bytes.fromhex(spec)


def read_until_closed(s, limit):
    got, closed = b"", False
    s.settimeout(0.2)
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        got += chunk
    return got, closed


def late(addr, port, wait, spec, limit="3"):
    """Connect, read whatever the server says for `wait` seconds without sending anything, then send
    `spec`; report what arrived before and after, and whether the connection was closed."""
    try:
        s = socket.create_connection((addr, int(port)), timeout=3)
    except OSError as e:
        return err(e)
    before, _ = read_until_closed(s, float(wait))
    try:
        s.sendall(payload(spec))
    except OSError as e:
        return {"before": before.decode("latin-1"), **err(e)}
    after, closed = read_until_closed(s, float(limit))
    return {"before": before.decode("latin-1"), "after": after.decode("latin-1"), "closed": closed}


def tunnel(proxy, port, authority, spec, limit="3"):
    """CONNECT through the explicit proxy, then send `spec` inside the tunnel; report the CONNECT status, what
    came back and whether the tunnel was closed."""
    try:
        s = socket.create_connection((proxy, int(port)), timeout=3)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(1)
            if not chunk:
                return {"status": None, "closed": True}
            head += chunk
        status = int(head.split(b" ")[1])
        if status != 200:
            return {"status": status, "closed": True}
        s.sendall(payload(spec))
        got, closed = read_until_closed(s, float(limit))
        return {"status": status, "received": got.decode("latin-1"), "closed": closed}
    except OSError as e:
        return err(e)


def many(kind, addr, port, count, authority="", limit="20"):
    """Open `count` connections (kind: tcp, or connect to `authority` through the explicit proxy at addr:port)
    and hold them; print {"held": n} (those still open after a short wait), then wait for a line on stdin
    and print how many were still open then."""
    socks = []
    for _ in range(int(count)):
        try:
            s = socket.create_connection((addr, int(port)), timeout=2)
            if kind == "connect":
                s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)).encode())
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = s.recv(1)
                    if not chunk:
                        break
                    head += chunk
                if not head.startswith(b"HTTP/1.1 200"):
                    s.close()
                    continue
            socks.append(s)
        except OSError:
            continue
    time.sleep(0.5)
    def alive():
        n = 0
        for s in socks:
            s.setblocking(False)
            open_ = True
            while True:
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    break
                except OSError:
                    open_ = False
                    break
                if not chunk:
                    open_ = False
                    break
            n += open_
        return n
    out({"held": alive()})
    sys.stdin.readline()
    out({"held": alive()})


# --- Interactive and timed modes --------------------------------------------------------------------------


def hold(kind, addr, port, sni, cafile, proxy, limit):
    """Open a connection, make one request on it, print {"ready": ...}, then keep it open and idle until the
    peer closes it (print {"closed_after": seconds since ready}) or a line arrives on stdin (close it
    ourselves: {"closed_by": "client"}) or `limit` s pass."""
    try:
        if kind == "tls":
            s = open_tls(addr, int(port), sni, cafile, proxy or None)
        else:
            s = socket.create_connection((addr, int(port)), timeout=5)
        s.sendall(request_text("GET", "/held", sni))
        r = read_response(s.makefile("rb"))
    except (OSError, ssl.SSLError, ValueError) as e:
        out(err(e))
        return
    out({"ready": True, "status": r.get("status")})
    ready = time.monotonic()
    sock = s
    while time.monotonic() - ready < float(limit):
        rs, _, _ = select.select([sock, sys.stdin], [], [], 0.05)
        if sys.stdin in rs:
            sys.stdin.readline()
            s.close()
            out({"closed_by": "client"})
            return
        if sock in rs:
            try:
                chunk = s.recv(65536)
            except (OSError, ssl.SSLError):
                chunk = b""
            if not chunk:
                out({"closed_after": time.monotonic() - ready})
                return
    out({"closed_after": None})


def attempt(kind, target, expect):
    """One try of `until`: True when the outcome is `expect` ("ok" or "denied")."""
    if kind == "dns":
        server, name = target.split(",")
        r = dns(server, name, timeout=0.5)
        ok = r.get("rcode") == 0 and bool(r.get("addrs"))
        denied = r.get("rcode") == 3
    else:
        addr, port, sni, cafile = target.split(",")
        r = https(addr, port, sni, cafile)
        ok = r.get("status") == 200
        denied = "error" in r
    return ok if expect == "ok" else denied


def until(kind, target, expect, limit):
    """Try every 20 ms until the outcome is `expect`: the wall-clock time it first was, and the tries before."""
    before = 0
    start = time.time()
    while time.time() - start < float(limit):
        if attempt(kind, target, expect):
            return {"first": time.time(), "before": before}
        before += 1
        time.sleep(0.02)
    return {"first": None, "before": before}


def flood(server, template, count):
    """`count` UDP queries, one after the other: how many were answered (any response code), and how many
    with each response code."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    s.connect((server, 53))
    answered = 0
    rcodes = {}
    for i in range(int(count)):
        qid, pkt = dns_packet(template.replace("N", str(i)), "A")
        s.send(pkt)
        try:
            msg = s.recv(4096)
            if struct.unpack("!H", msg[:2])[0] == qid:
                answered += 1
                rcode = str(msg[3] & 0xF)
                rcodes[rcode] = rcodes.get(rcode, 0) + 1
        except socket.timeout:
            pass
    return {"answered": answered, "rcodes": rcodes}


def urllib_get(url, cafile, proxy):
    import urllib.request

    handlers = [urllib.request.ProxyHandler({"http": proxy, "https": proxy} if proxy else {})]
    if url.startswith("https"):
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=5) as r:
            return {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()}
    except OSError as e:
        return err(e)


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "dns":
        out(dns(*args))
    elif mode == "https":
        out(https(*args))
    elif mode == "session":
        out(session(args[0], args[1], json.loads(args[2]), args[3] == "pipelined"))
    elif mode == "each":
        out([session(args[0], args[1], [r])[0] for r in json.loads(args[2])])
    elif mode == "hellos":
        out(hellos(args[0], args[1], json.loads(args[2])))
    elif mode == "split-hello":
        out(split_hello(*args))
    elif mode == "steps":
        steps(*args)
    elif mode == "raw":
        out(raw(*args))
    elif mode == "cut":
        out(cut(*args))
    elif mode == "hold":
        hold(*args)
    elif mode == "late":
        out(late(*args))
    elif mode == "tunnel":
        out(tunnel(*args))
    elif mode == "many":
        many(*args)
    elif mode == "until":
        out(until(*args))
    elif mode == "flood":
        out(flood(*args))
    elif mode == "urllib":
        out(urllib_get(*args))
    else:
        out({"error": "unknown mode " + mode})


main()
