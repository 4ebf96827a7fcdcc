#!/usr/bin/env bash
# API fuzzing: schemathesis against a real `agenthold serve` (its own data dir, a free loopback port), checking
# every operation of /api/v1/openapi.json for server errors (5xx) and for answers the document does not
# describe (status code, content type, body schema). Needs root and Docker like the integration tests.
#
#   scripts/api-fuzz.sh [SCHEMATHESIS-RUN-ARGS…]     (make api-fuzz)
#
# Uses the agenthold binary of the last `cargo build` / `make unit` (target/debug/agenthold, or $AGENTHOLD);
# builds it only when it is missing. Schemathesis is pinned and installed once into target/python/schemathesis
# (Python >= 3.11). The fixture is one user with a personal token and a browser session, one workspace and one
# agent (a real sandbox), and where the document has them an exec and a secret; path parameters {ws}, {agent},
# {user}, {exec}, {secret} (and the file API's ?path=) are pinned to them so requests reach the handlers
# instead of 404. Rate limits are off for the run (fuzzing is a burst by design; the rate limits have
# their own tests). Bounded: FUZZ_EXAMPLES cases per operation and phase, FUZZ_TIMEOUT seconds in all.
# Not fuzzed: the WebSocket terminal and the SSE streams (a request there stays open until the server ends
# it; their handshake and first answer are covered by the role matrix test).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
SCHEMATHESIS_VERSION=4.32.5
PYTHON=${PYTHON311:-/usr/bin/python3.11}
VENV=target/python/schemathesis
FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-20}
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-240}
BIN=${AGENTHOLD:-${CARGO_TARGET_DIR:-target}/debug/agenthold}
log() { printf 'api-fuzz: %s\n' "$*" >&2; }

if [ ! -x "$BIN" ]; then
  log "no $BIN yet: building agenthold-server"
  cargo build -q -p agenthold-server
fi
BIN=$(realpath "$BIN")

if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -qF "version $SCHEMATHESIS_VERSION"; then
  log "installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION"
fi

# The sandbox's image (quick when it is current).
"$BIN" image build-dev >/dev/null

work=$(mktemp -d -t agenthold-fuzz.XXXXXX)
data=$work/data
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
cat >"$work/config.yaml" <<EOF
data_dir: $data
server:
  listen: 127.0.0.1:$port
auth:
  rate_per_user: 0
  rate_per_token: 0
  rate_unauthenticated: 0
EOF

server=
token=
# Stop the server and remove whatever engine objects its installation left (agents the fuzzer created
# included): first through the API, then by the installation label.
cleanup() {
  local rc=$?
  set +e
  if [ -n "$server" ] && [ -n "$token" ] && kill -0 "$server" 2>/dev/null; then
    for ws in $(api GET /api/v1/workspaces | json '[w["id"] for w in v["items"]]'); do
      for agent in $(api GET "/api/v1/workspaces/$ws/agents?limit=500" | json '[a["id"] for a in v["items"]]'); do
        api DELETE "/api/v1/workspaces/$ws/agents/$agent" >/dev/null
      done
    done
  fi
  if [ -n "$server" ]; then
    kill -TERM "$server" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server" 2>/dev/null
    wait "$server" 2>/dev/null
  fi
  local instance label
  instance=$(printf %s "$data" | sha256sum | cut -c1-12)
  label=label=agenthold.instance=$instance
  mapfile -t containers < <(docker ps -aq --filter "$label")
  [ ${#containers[@]} -eq 0 ] || docker rm -fv "${containers[@]}" >/dev/null
  for net in $(docker network ls -q --filter "$label"); do
    bridge=$(docker network inspect -f '{{index .Options "com.docker.network.bridge.name"}}' "$net")
    if [ -n "$bridge" ]; then
      iptables -S DOCKER-USER | tr -d '"' | grep -F -- "--comment agenthold:$bridge" | sed 's/^-A /-D /' |
        while read -r rule; do read -ra args <<<"$rule"; iptables "${args[@]}"; done
    fi
    docker network rm "$net" >/dev/null
  done
  mapfile -t volumes < <(docker volume ls -q --filter "$label")
  [ ${#volumes[@]} -eq 0 ] || docker volume rm -f "${volumes[@]}" >/dev/null
  nft delete table inet "agenthold_host_$instance" 2>/dev/null
  if [ $rc -ne 0 ]; then
    log "failed ($rc); the server's log:"
    tail -n 40 "$work/serve.log" >&2
  fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# `api METHOD PATH [JSON]`: a call with the fixture user's token; prints the body.
api() {
  local args=(-sS -X "$1" -H "Authorization: Bearer $token" "$base$2")
  [ $# -lt 3 ] || args+=(-H 'Content-Type: application/json' --data "$3")
  curl "${args[@]}"
}
# `json EXPR`: evaluate a Python expression over the JSON document `v` on stdin; lists print one a line.
json() {
  "$PYTHON" -c 'import json, sys
v = json.load(sys.stdin)
r = eval(sys.argv[1])
print("\n".join(r) if isinstance(r, list) else r)' "$1"
}
admin() { "$BIN" admin "$@" --config "$work/config.yaml"; }

"$BIN" serve --config "$work/config.yaml" >"$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 600); do
  curl -fsS "$base/healthz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { log "agenthold serve exited"; exit 1; }
  sleep 0.1
done
curl -fsS "$base/healthz" >/dev/null || { log "agenthold serve did not answer /healthz"; exit 1; }

user=$(admin user create --name fuzz)
token=$(admin token create --user "$user")
session=$(admin session create --user "$user")
ws=$(api POST /api/v1/workspaces '{"name": "fuzz"}' | json 'v["id"]')
agent=$(api POST "/api/v1/workspaces/$ws/agents" '{"name": "fuzz"}' | json 'v["id"]')
doc=$(curl -fsS "$base/api/v1/openapi.json")
has() { json "\"$1\" in v[\"paths\"]" <<<"$doc" | grep -q True; }
# More fixtures where the document has their operations: a finished exec, a secret attached to the agent.
pins=()
if has "/api/v1/workspaces/{ws}/agents/{agent}/execs"; then
  exec_id=$(api POST "/api/v1/workspaces/$ws/agents/$agent/execs" '{"argv": ["true"]}' | json 'v["id"]')
  pins+=("\"path.exec\" = \"$exec_id\"")
fi
if has "/api/v1/workspaces/{ws}/secrets"; then
  secret=$(api POST "/api/v1/workspaces/$ws/secrets" '{"name": "fuzz", "value": "x", "preset": "openai"}' | json 'v["id"]')
  pins+=("\"path.secret\" = \"$secret\"")
fi
pins+=('"query.path" = "/tmp/fuzz"')
log "server on $base; workspace $ws, agent $agent"

# Path parameters pinned to the fixture; deleting the fixture agent would leave the rest with nothing to
# reach, so that one operation gets an id that does not exist. Creating a token needs a browser session
# (S7): that operation sends the session cookie and an Authorization header that carries no token.
cat >"$work/schemathesis.toml" <<EOF
headers = { Authorization = "Bearer $token" }

[parameters]
"path.ws" = "$ws"
"path.agent" = "$agent"
"path.user" = "$user"
$(printf '%s\n' "${pins[@]}")

[[operations]]
include-name = "DELETE /api/v1/workspaces/{ws}/agents/{agent}"
parameters = { "path.agent" = "nosuchagent0000a" }

[[operations]]
include-name = "POST /api/v1/me/tokens"
headers = { Authorization = "none", Cookie = "agenthold_session=$session" }
EOF

# The streams: SSE (text/event-stream answers) and the WebSocket terminal (101), read from the document.
mapfile -t streams < <(json '[
  m.upper() + " " + p for p, ops in v["paths"].items() for m, o in ops.items()
  if isinstance(o, dict) and any("101" == s or "text/event-stream" in (r.get("content") or {})
                                 for s, r in o.get("responses", {}).items())]' <<<"$doc")
exclude=()
for op in "${streams[@]}"; do
  [ -n "$op" ] || continue
  log "not fuzzed (a stream): $op"
  exclude+=(--exclude-name "$op")
done

set +e
# From the work directory: schemathesis keeps a cache in the current one.
(cd "$work" && timeout --kill-after=10 "$FUZZ_TIMEOUT" "$root/$VENV/bin/schemathesis" --config-file "$work/schemathesis.toml" \
  run "$base/api/v1/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --phases examples,coverage,fuzzing --max-examples "$FUZZ_EXAMPLES" --request-timeout 30 \
  --suppress-health-check all --seed "${FUZZ_SEED:-$RANDOM}" \
  "${exclude[@]}" "$@")
rc=$?
set -e
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  log "schemathesis did not finish within $FUZZ_TIMEOUT s"
fi
exit $rc
