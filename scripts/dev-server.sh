#!/usr/bin/env bash
# `make dev`: the reference server on a throwaway data directory, with a demo workspace and agent created
# through the API, and a local admin link that opens the web UI on them. Ctrl-C deletes the demo's agents through the API, stops the server and removes the data
# directory: no container, network or rule is left behind.
#
# AGENTHOLD_DEV_PORT picks the port (default: 8080, or a free one when 8080 is taken).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build -q -p agenthold-server
AH=$PWD/target/debug/agenthold
DATA=$(mktemp -d /tmp/agenthold-dev.XXXXXX)
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
setsid "$AH" serve --config "$DATA/config.yaml" &
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
echo "Ctrl-C stops the server and removes the demo (agent, network, rules, data)."
wait "$SERVER"
