#!/usr/bin/env bash
# The seeds' end-to-end egress check (E18), against the dev stack: run it after `make dev` (which builds the
# `agenthold/dev` image), as root. `make test` runs it too (`make e2e`).
#
# One sandbox on the embedded runtime with an allowlist and a secret; from inside it: an allowed name (explicit
# proxy and transparent path), a denied name, the metadata address refused although allowed, NXDOMAIN for an
# unlisted name, the secret injected upstream but never visible inside. Then the request log is checked here:
# one line per connection with the contract's fields, the allowed request marked `secret_injected`, the denied
# name and the metadata address logged as denied. The upstream is a loopback echo server; nothing leaves the host.
# enforces: E18
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d -t agenthold-e2e.XXXXXX)
trap 'rm -rf "$out"' EXIT

if ! docker image inspect agenthold/dev:latest >/dev/null 2>&1; then
  echo "e2e: the agenthold/dev image is missing: run 'make dev' first" >&2
  exit 1
fi
cargo build -q -p agenthold-examples --bin e2e_egress
./target/debug/e2e_egress "$out"

python3 - "$out/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
need = {"time", "agent", "kind", "host", "port", "method", "path", "status", "decision", "reason",
        "secret_injected", "bytes_up", "bytes_down"}
checks = {
    "log: every line has the contract's fields": bool(rows) and all(need <= set(r) for r in rows),
    "log: the allowed request, secret injected": any(
        r["host"] == "api.e2e.test" and r["decision"] == "allowed" and r["secret_injected"] for r in rows),
    "log: the denied name, denied": any(
        r["host"] == "denied.e2e.test" and r["decision"] == "denied" for r in rows),
    "log: the metadata address, denied by the address guard": any(
        r["host"] == "169.254.169.254" and r["decision"] == "denied" and r["reason"] != "not_in_allowlist"
        for r in rows),
    "log: the unlisted name's DNS query, denied": any(
        r["kind"] == "dns" and r["host"] == "unlisted.e2e.test" and r["decision"] == "denied" for r in rows),
    "log: the secret's value appears nowhere": all("sk-e2e-secret-value" not in json.dumps(r) for r in rows),
}
for name, ok in checks.items():
    print(("ok    " if ok else "FAIL  ") + name)
if not all(checks.values()):
    print(json.dumps(rows, indent=1), file=sys.stderr)
    sys.exit(1)
PY
echo "e2e egress: all checks passed"
