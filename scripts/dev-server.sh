#!/usr/bin/env bash
# `make dev`: the reference server on a throwaway data directory, with a demo workspace and agent created
# through the API, and a local admin link that opens the web UI on them. Ctrl-C deletes the demo's agents through the API, stops the server and removes the data
# directory: no container, network or rule is left behind.
#
# With the harness image (`make harness-image`), it also starts the provider stand-in (agenthold-standin: the
# Anthropic Messages and OpenAI Responses APIs on loopback, scripted), points the gateway's api.anthropic.com
# and api.openai.com at it, and runs one Claude Code prompt in a demo agent, printing the run's events as
# they stream: a real harness run without any account. No request leaves the machine for those hosts.
#
# AGENTHOLD_DEV_PORT picks the port (default: 8080, or a free one when 8080 is taken).
# AGENTHOLD_DEV_STANDIN=0 skips the stand-in and the demo run (the providers' hosts are then the real ones).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build -q -p agenthold-server
cargo build -q -p agenthold-testsupport --bin agenthold-standin
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
AH=$TARGET/debug/agenthold
DATA=$(mktemp -d /tmp/agenthold-dev.XXXXXX)
STANDIN_PID=""
SERVE_ARGS=()
if [ "${AGENTHOLD_DEV_STANDIN:-1}" != 0 ] && docker image inspect agenthold/harness:latest >/dev/null 2>&1; then
  "$TARGET/debug/agenthold-standin" --ca-out "$DATA/standin-ca.pem" >"$DATA/standin.log" 2>&1 &
  STANDIN_PID=$!
  for _ in $(seq 100); do grep -q '^listening ' "$DATA/standin.log" 2>/dev/null && break; sleep 0.05; done
  STANDIN=$(sed -n 's/^listening //p' "$DATA/standin.log")
  [ -n "$STANDIN" ] || { echo "make dev: the stand-in did not start: $(cat "$DATA/standin.log")" >&2; exit 1; }
  SERVE_ARGS=(--dangerous-connect-to "api.anthropic.com:443=$STANDIN"
              --dangerous-connect-to "api.openai.com:443=$STANDIN"
              --dangerous-upstream-ca "$DATA/standin-ca.pem")
fi
PORT=${AGENTHOLD_DEV_PORT:-}
if [ -z "$PORT" ]; then
  PORT=$(python3 - <<'PY'
import socket
s = socket.socket()
try:
    s.bind(("127.0.0.1", 8080))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
PY
)
fi
BASE=http://127.0.0.1:$PORT
cat >"$DATA/config.yaml" <<YAML
data_dir: $DATA/data
server:
  listen: 127.0.0.1:$PORT
YAML

# Its own session: Ctrl-C reaches this script (which cleans up in order), not the server directly.
setsid "$AH" serve --config "$DATA/config.yaml" "${SERVE_ARGS[@]}" &
SERVER=$!
TOKEN=""
WS=""

api() { # METHOD PATH [JSON]
  curl -sS --max-time 120 -X "$1" -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
    ${3:+-d "$3"} "$BASE$2"
}
json() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval("d"+sys.argv[1]))' "$1"; }

cleanup() {
  trap - INT TERM EXIT
  echo
  echo "make dev: stopping"
  if [ -n "$TOKEN" ] && [ -n "$WS" ]; then
    for a in $(api GET "/api/v1/workspaces/$WS/agents" |
      python3 -c 'import json,sys; [print(i["id"]) for i in json.load(sys.stdin)["items"]]' 2>/dev/null); do
      api DELETE "/api/v1/workspaces/$WS/agents/$a" >/dev/null && echo "  deleted agent $a"
    done
  fi
  kill -TERM "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  if [ -n "$STANDIN_PID" ]; then kill -TERM "$STANDIN_PID" 2>/dev/null || true; fi
  # The installation's label: the first 12 hex digits of SHA-256 of the data directory's path.
  instance=$(printf '%s' "$DATA/data" | sha256sum | cut -c1-12)
  left=$( (docker ps -aq --filter "label=agenthold.instance=$instance";
           docker network ls -q --filter "label=agenthold.instance=$instance") | wc -l)
  rm -rf "$DATA"
  if [ "$left" -eq 0 ]; then
    echo "make dev: stopped; nothing left behind"
  else
    echo "make dev: stopped, but $left engine object(s) labelled agenthold.instance=$instance remain" >&2
    exit 1
  fi
}
trap cleanup INT TERM EXIT

for _ in $(seq 300); do curl -fsS "$BASE/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "$BASE/healthz" >/dev/null

# The demo belongs to the local admin, so the browser sees it: redeem one admin link here for a session,
# make a personal token from it (tokens are made only from a browser session), and print a fresh link.
LINK=$("$AH" admin login-link --config "$DATA/config.yaml")
JAR="$DATA/cookies"
curl -fsS --max-time 30 -c "$JAR" -H "Content-Type: application/json" \
  -d "{\"token\":\"${LINK#*#}\"}" "$BASE/auth/local" >/dev/null
TOKEN=$(curl -fsS --max-time 30 -b "$JAR" -H "Content-Type: application/json" -d '{"name":"make-dev"}' \
  "$BASE/api/v1/me/tokens" | json '["token"]')
rm -f "$JAR"
WS=$(api POST /api/v1/workspaces '{"name":"demo"}' | json '["id"]')
AGENT=$(api POST "/api/v1/workspaces/$WS/agents" \
  '{"name":"demo-agent","policy":{"mode":"allowlist","entries":["example.com"]},"labels":{"made-by":"make-dev"}}' \
  | json '["id"]')
if [ -n "$STANDIN_PID" ]; then
  # A Claude Code run against the stand-in: a harness agent, a key that is only ever injected by the gateway
  # (the sandbox sees a placeholder), one prompt, the events as they stream.
  CLAUDE=$(api POST "/api/v1/workspaces/$WS/agents" \
    '{"name":"claude-demo","image":"agenthold/harness:latest","policy":{"mode":"allowlist","entries":["api.anthropic.com"]},"labels":{"made-by":"make-dev"}}' \
    | json '["id"]')
  SECRET=$(api POST "/api/v1/workspaces/$WS/secrets" \
    '{"name":"anthropic-demo","value":"sk-ant-demo-not-a-real-key","preset":"anthropic"}' | json '["id"]')
  api PUT "/api/v1/workspaces/$WS/agents/$CLAUDE/secrets/$SECRET" '{"env":"ANTHROPIC_API_KEY"}' >/dev/null
  RUN=$(api POST "/api/v1/workspaces/$WS/agents/$CLAUDE/runs" \
    '{"harness":"claude","prompt":"Say hello from the sandbox with the Bash tool."}' | json '["id"]')
  echo
  echo "a Claude Code run ($RUN) in agent claude-demo ($CLAUDE), against the local stand-in at $STANDIN:"
  curl -sSN --max-time 180 -H "Authorization: Bearer $TOKEN" \
    "$BASE/api/v1/workspaces/$WS/agents/$CLAUDE/runs/$RUN/events" | python3 -u -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("data:"):
        continue
    e = json.loads(line[5:])
    kind = e.pop("type")
    print("  %-12s %s" % (kind, json.dumps(e)[:160]))
    if kind == "end":
        break
' || echo "make dev: the demo run's stream ended early" >&2
fi

LINK=$("$AH" admin login-link --config "$DATA/config.yaml")
echo
echo "agenthold server: $BASE   (API document: $BASE/api/v1/openapi.json)"
echo "open the web UI as the local admin (one-time link, 15 minutes; \`$AH admin login-link --config $DATA/config.yaml\` makes another):"
echo "  $LINK"
echo "demo workspace $WS with agent $AGENT (allowlist: example.com)"
echo "a personal token of the local admin (shown once):"
echo "  export TOKEN=$TOKEN"
echo "try:"
echo "  curl -s -H \"Authorization: Bearer \$TOKEN\" $BASE/api/v1/workspaces/$WS/agents/$AGENT"
echo "  curl -s -H \"Authorization: Bearer \$TOKEN\" -H 'Content-Type: application/json' \\"
echo "       -d '{\"argv\":[\"uname\",\"-a\"]}' $BASE/api/v1/workspaces/$WS/agents/$AGENT/execs"
if [ -n "$STANDIN_PID" ]; then
  echo "another run against the stand-in (api.anthropic.com and api.openai.com lead to it):"
  echo "  curl -s -H \"Authorization: Bearer \$TOKEN\" -H 'Content-Type: application/json' \\"
  echo "       -d '{\"harness\":\"claude\",\"prompt\":\"hi\"}' $BASE/api/v1/workspaces/$WS/agents/$CLAUDE/runs"
fi
echo "Ctrl-C stops the server and removes the demo (agent, network, rules, data)."
wait "$SERVER"
