#!/usr/bin/env bash
# Install and start what agenthold needs, when missing. Idempotent; needs root (apt, dockerd).
#
#   scripts/ensure-deps.sh dev    what `make dev` needs: Docker engine, nftables, iptables, iproute2,
#                                 util-linux (nsenter), debootstrap and tar (the dev image build), Node.js
#                                 and npm (the web UI's build)
#   scripts/ensure-deps.sh test   all of the above, plus the clients the tests drive (curl, git, openssl,
#                                 python requests, Chromium for the browser tests), dnsmasq, gVisor (runsc)
#                                 and cargo-audit
#
# `make dev` installs only the first set, so a new machine reaches the server without waiting for test tools
# (cargo-audit alone takes about ten minutes to build).
set -euo pipefail

mode=${1:-test}
case $mode in dev | test) ;; *) echo "usage: $0 dev|test" >&2; exit 2 ;; esac
log() { printf 'ensure-deps(%s): %s\n' "$mode" "$*" >&2; }

need_pkgs=()
want() { command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2"); }
want dockerd docker.io
want nft nftables
want iptables iptables
want ip iproute2
want nsenter util-linux
want debootstrap debootstrap
want tar tar
want node nodejs
want npm npm
if [ "$mode" = test ]; then
  want curl curl
  want git git
  want openssl openssl
  want dnsmasq dnsmasq-base
  want runsc runsc
  want chromium chromium
  # PostgreSQL's server binaries are not on PATH: the store tests start one from /usr/lib/postgresql.
  compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || need_pkgs+=(postgresql)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "missing ${need_pkgs[*]} and not root: install them or run as root"; exit 1
  fi
  log "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# Docker engine: start it when its socket does not answer.
if ! docker version >/dev/null 2>&1; then
  log "starting dockerd"
  mkdir -p /var/log
  setsid nohup dockerd >/var/log/agenthold-dockerd.log 2>&1 &
  for _ in $(seq 60); do
    docker version >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker version >/dev/null 2>&1 || { log "dockerd did not come up; see /var/log/agenthold-dockerd.log"; exit 1; }
fi

if [ "$mode" = test ]; then
  # Clients the tests drive from inside sandboxes and jails.
  if ! python3 -c 'import requests' >/dev/null 2>&1; then
    log "installing python requests"
    python3 -m pip install --quiet requests
  fi
  if ! command -v cargo-audit >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo-audit" ]; then
    log "installing cargo-audit (takes several minutes once)"
    cargo install cargo-audit --locked --quiet
  fi
fi
log "ok"
