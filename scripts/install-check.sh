#!/usr/bin/env bash
# Check README's install lines on a clean prefix, as a new user would run them (run by `make test`):
#   cargo install --path agenthold-server     → `agenthold` on PATH, runs a command behind the gateway
#   pip install ./bindings/python             → `import agenthold` in a fresh venv
#   cargo add --path … / cargo add --git …    → a new crate that embeds the runtime type-checks
# To stay fast it reuses the workspace's build: `cargo install --debug` into target/, and a new crate checked
# with the workspace's lock file and target directory. The lines are otherwise the README's.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d -t agenthold-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
step() { printf 'install-check: %s\n' "$*" >&2; }

step "cargo install --path agenthold-server (into $tmp/prefix)"
cargo install -q --locked --debug --path agenthold-server --root "$tmp/prefix" --target-dir "$root/target"
PATH="$tmp/prefix/bin:$PATH"
[ "$(command -v agenthold)" = "$tmp/prefix/bin/agenthold" ]
agenthold --version
agenthold run --data-dir "$tmp/data" -- sh -c 'exit 3' && rc=0 || rc=$?
[ "$rc" = 3 ] || { step "agenthold run returned $rc, expected the command's 3"; exit 1; }

step "pip install ./bindings/python (fresh venv)"
python3 -m venv "$tmp/venv"
# The wheel build reuses the workspace's release artefacts (make python built them).
CARGO_TARGET_DIR="$root/target" "$tmp/venv/bin/pip" install -q ./bindings/python
(cd "$tmp" && "$tmp/venv/bin/python" -c 'import agenthold; print("agenthold", agenthold.__version__); agenthold.Policy.allowlist(["example.com"])')

new_crate() {
  cargo new -q --lib "$tmp/$1"
  cp "$root/Cargo.lock" "$tmp/$1/Cargo.lock"
  cat >"$tmp/$1/src/lib.rs" <<'RS'
//! A platform that embeds agenthold.
/// Build a runtime; the allowlist is what the platform would give its first sandbox.
pub async fn start() -> Result<agenthold_sandbox::Runtime, Box<dyn std::error::Error + Send + Sync>> {
    let _policy = agenthold_core::NetworkPolicy::parse(agenthold_core::PolicyMode::Allowlist, &["example.com"])?;
    Ok(agenthold_sandbox::Runtime::builder().data_dir("/tmp/agenthold-embedded").build().await?)
}
RS
}

step "cargo add --path (a new crate)"
new_crate by-path
(cd "$tmp/by-path" && cargo add -q --path "$root/agenthold-sandbox" && cargo add -q --path "$root/agenthold-core" &&
  cargo check -q --target-dir "$root/target/install-check")

if git -C "$root" rev-parse --verify -q HEAD >/dev/null; then
  step "cargo add --git (a new crate, the checkout's committed HEAD)"
  new_crate by-git
  (cd "$tmp/by-git" && cargo add -q --git "file://$root" agenthold-sandbox agenthold-core &&
    cargo check -q --target-dir "$root/target/install-check")
else
  step "cargo add --git skipped: this tree is not a git checkout"
fi
step ok
