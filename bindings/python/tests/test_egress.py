"""Egress and secrets driven from Python (E8, E9, E11–E13, E16): curl inside real sandboxes against the
local upstream, through the real gateway."""

from __future__ import annotations

import json
import time
import uuid
from typing import Callable

import agenthold
from conftest import API, OTHER, SECRET_VALUE, UNMAPPED, DnsResponder, Upstream, curl

Make = Callable[..., agenthold.Sandbox]


def api_secret() -> agenthold.Secret:
    return agenthold.Secret("api", SECRET_VALUE, env="API_KEY", hosts=[API], header="Authorization",
                            template="Bearer {{.Value}}")


def resolve(sb: agenthold.Sandbox, name: str) -> str:
    """Resolve `name` with the sandbox's libc: the address, or NXDOMAIN / the error."""
    code = ("import socket, sys\n"
            "try:\n"
            f"    print(socket.getaddrinfo({name!r}, 443, type=socket.SOCK_STREAM)[0][4][0])\n"
            "except socket.gaierror as e:\n"
            "    print('NXDOMAIN' if e.errno == socket.EAI_NONAME else 'ERROR %s' % e)\n")
    return sb.exec(["python3", "-c", code]).stdout.decode().strip()


def test_allowed_and_denied_names(make_sandbox: Make, upstream: Upstream) -> None:
    sb = make_sandbox(policy=agenthold.Policy.allowlist([API]))
    path = f"/allowed-{uuid.uuid4().hex}"
    ok = sb.exec(curl(f"https://{API}{path}"))
    assert ok.exit_code == 0, ok.stderr
    assert json.loads(ok.stdout)["upstream"] == "upstream-ok"
    via_proxy = sb.exec(curl(f"https://{API}{path}-proxy", proxy=True))
    assert b"upstream-ok" in via_proxy.stdout, via_proxy.stderr
    denied = sb.exec(curl(f"https://{OTHER}/denied"))
    assert denied.exit_code != 0
    denied_proxy = sb.exec(curl(f"https://{OTHER}/denied", proxy=True))
    assert denied_proxy.exit_code != 0
    assert not upstream.seen("/denied")
    assert upstream.seen(path)


def test_unlisted_names_get_nxdomain_and_never_reach_upstream_dns(make_sandbox: Make, dns: DnsResponder) -> None:
    sb = make_sandbox(policy=agenthold.Policy.allowlist([API, UNMAPPED]))
    leak = f"exfil-{uuid.uuid4().hex[:12]}.example.test"
    assert resolve(sb, leak) == "NXDOMAIN"
    assert not dns.asked(leak), "an unlisted name reached the upstream DNS server"
    # An allowed name that is not mapped is forwarded: our responder answers NXDOMAIN.
    assert resolve(sb, UNMAPPED) == "NXDOMAIN"
    assert dns.asked(UNMAPPED)
    # A mapped, allowed name resolves (to a gateway-side address, not loopback).
    addr = resolve(sb, API)
    assert addr and addr not in ("NXDOMAIN", "127.0.0.1"), addr
    log = sb.request_log()
    dns_denied = [e for e in log if e.kind == "dns" and e.host == leak]
    assert dns_denied and all(e.decision == "denied" for e in dns_denied)


def test_placeholder_inside_value_injected_upstream(make_sandbox: Make, upstream: Upstream) -> None:
    secret = agenthold.Secret("api", SECRET_VALUE, env="API_KEY", hosts=[API], header="Authorization",
                              template="Bearer {{.Value}}", also_in={"headers": ["x-echo"]})
    sb = make_sandbox(policy=agenthold.Policy.allowlist([API, OTHER]), secrets=[secret])
    shown = sb.exec(["sh", "-c", "echo $API_KEY; env; cat /proc/1/environ | tr '\\0' '\\n'"])
    out = shown.stdout.decode()
    assert SECRET_VALUE not in out and SECRET_VALUE not in shown.stderr.decode()
    placeholder = out.splitlines()[0]
    assert placeholder.startswith("agenthold-placeholder-")
    assert placeholder != SECRET_VALUE

    path = f"/inject-{uuid.uuid4().hex}"
    r = sb.exec(curl(f"https://{API}{path}", "-o", "/dev/null", "-w", "%{http_code}",
                     "-H", "X-Echo: key=$API_KEY".replace("$API_KEY", placeholder)))
    assert r.stdout == b"200", r.stderr
    [seen] = upstream.seen(path)
    headers = seen["headers"]
    assert isinstance(headers, dict)
    assert headers["authorization"] == f"Bearer {SECRET_VALUE}"
    assert headers["x-echo"] == f"key={SECRET_VALUE}"  # also_in names this header
    # Anywhere else the rule does not name, the placeholder is a leak attempt: refused, never sent.
    refused = f"/misplaced-{uuid.uuid4().hex}"
    r = sb.exec(curl(f"https://{API}{refused}", "-o", "/dev/null", "-w", "%{http_code}",
                     "-H", f"anthropic-beta: {placeholder}"))
    assert r.stdout == b"403", r.stderr
    assert not upstream.seen(refused)
    # Through the explicit proxy as well.
    path2 = path + "-proxy"
    sb.exec(curl(f"https://{API}{path2}", "-o", "/dev/null", proxy=True))
    assert upstream.seen(path2)[0]["headers"]["authorization"] == f"Bearer {SECRET_VALUE}"  # type: ignore[index]

    # A host without a rule gets neither the header nor the value (the placeholder goes through unchanged).
    path3 = f"/no-rule-{uuid.uuid4().hex}"
    sb.exec(curl(f"https://{OTHER}{path3}", "-o", "/dev/null", "-H", f"X-Echo: {placeholder}"))
    [other] = upstream.seen(path3)
    assert SECRET_VALUE not in json.dumps(other)
    assert other["headers"]["x-echo"] == placeholder  # type: ignore[index]

    log = sb.request_log()
    injected = [e for e in log if e.path == path]
    assert injected and injected[0].secret_injected and injected[0].secret == "api"
    assert not any(e.secret_injected for e in log if e.path == path3)
    assert SECRET_VALUE not in repr([e.to_dict() for e in log])


def test_answers_never_carry_the_value(make_sandbox: Make, upstream: Upstream) -> None:
    """E19: the upstream echoes the injected header; the sandbox reads the placeholder in its place."""
    sb = make_sandbox(policy=agenthold.Policy.allowlist([API]), secrets=[api_secret()])
    path = f"/echo-{uuid.uuid4().hex}"
    r = sb.exec(["sh", "-c", " ".join(curl(f"https://{API}{path}")) + "; echo; echo $API_KEY"])
    answer, placeholder = r.stdout.decode().splitlines()[:2]
    assert SECRET_VALUE not in r.stdout.decode()
    # The rendered header value ("Bearer …") is one of the forms: replaced whole by the placeholder.
    assert json.loads(answer)["headers"]["authorization"] == placeholder
    assert upstream.seen(path)[0]["headers"]["authorization"] == f"Bearer {SECRET_VALUE}"  # type: ignore[index]


def test_no_injection_over_plain_http(make_sandbox: Make, upstream: Upstream) -> None:
    sb = make_sandbox(policy=agenthold.Policy.allowlist([API]), secrets=[api_secret()])
    path = f"/plain-{uuid.uuid4().hex}"
    sb.exec(["sh", "-c", f"curl -sS -m 10 --noproxy '*' -H \"X-Echo: $API_KEY\" http://{API}{path} -o /dev/null"])
    for seen in upstream.seen(path):
        assert SECRET_VALUE not in json.dumps(seen)


def test_live_policy_change_applies_to_the_next_request(make_sandbox: Make, upstream: Upstream) -> None:
    sb = make_sandbox(policy=agenthold.Policy.allowlist([API]))
    first = sb.exec(curl(f"https://{API}/live-1"))
    assert first.exit_code == 0, first.stderr
    sb.set_policy(agenthold.Policy.allowlist([OTHER]))
    second = sb.exec(curl(f"https://{API}/live-2"))
    assert second.exit_code != 0
    assert sb.exec(curl(f"https://{OTHER}/live-3")).exit_code == 0
    sb.set_policy(agenthold.Policy.open())
    assert sb.exec(curl(f"https://{API}/live-4")).exit_code == 0
    assert not upstream.seen("/live-2")
    denied = [e for e in sb.request_log() if e.host == API and e.decision == "denied"]
    assert denied


def test_report_only_logs_but_lets_through(make_sandbox: Make) -> None:
    sb = make_sandbox(policy=agenthold.Policy.report_only([OTHER]))
    r = sb.exec(curl(f"https://{API}/report-only"))
    assert r.exit_code == 0, r.stderr
    reported = [e for e in sb.request_log() if e.host == API and (e.reason or "").startswith("report_only:")]
    assert reported and all(e.decision == "allowed" for e in reported)


def test_request_log_entries(make_sandbox: Make) -> None:
    sb = make_sandbox(policy=agenthold.Policy.allowlist([API]), secrets=[api_secret()])
    sb.exec(curl(f"https://{API}/logged?token=abc", "-o", "/dev/null"))
    sb.exec(curl(f"https://{OTHER}/refused"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        log = sb.request_log()
        if any(e.kind == "http" and e.path == "/logged" for e in log):
            break
        time.sleep(0.1)
    fields = ["time", "kind", "host", "port", "method", "path", "status", "decision", "reason",
              "secret_injected", "secret", "bytes_up", "bytes_down"]
    for e in log:
        for f in fields:
            getattr(e, f)
        assert set(fields) <= set(e.to_dict())
        assert e.agent == sb.id
        assert e.kind in ("dns", "tcp", "tls", "http", "connect")
        assert e.decision in ("allowed", "denied")
    [http] = [e for e in log if e.kind == "http" and e.path == "/logged"]
    assert (http.host, http.port, http.method, http.status, http.decision) == (API, 443, "GET", 200, "allowed")
    assert http.secret_injected and http.secret == "api"
    assert http.bytes_down > 0
    assert "abc" not in (http.path or "")  # the query string is not logged
    assert any(e.host == OTHER and e.decision == "denied" and e.reason for e in log)
    assert all(isinstance(e.time, str) and e.time.endswith("Z") for e in log)
