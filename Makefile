# agenthold: the two commands a new machine needs are `make dev` and `make test`.
# enforces: S14
SHELL := /bin/bash
CARGO ?= cargo
ADVISORY_DB ?= ../shared/advisory-db

.PHONY: harness-image dev quickstart test deps deps-dev lint audit unit api-fuzz python install-check e2e fuzz ui ui-test browser-test \
	bench bench-short bench-deps bench-report

## dev: the reference server on a throwaway data directory with a demo workspace and agent made through the
## API; it prints the local admin link and a token, and streams one Claude Code run against the local provider
## stand-in (no account needed). Ctrl-C removes everything it made. Builds the dev and harness images once. `make quickstart` runs the embedded-runtime quickstart instead.
dev: deps-dev ui harness-image
	./scripts/dev-server.sh

## harness-image: agenthold/harness:latest (the dev image, built first when missing, plus the pinned claude and
## codex binaries from npm, sha512-checked). Reused in a fraction of a second when current; the first build
## downloads ~360 MB and takes a few minutes.
harness-image: deps-dev
	$(CARGO) run -q -p agenthold-server -- image build-harness

## quickstart: the embedded default: a Runtime, one sandbox with an allowlist and a secret, a command against
## a local upstream, and the request log.
quickstart: deps-dev
	$(CARGO) run -q -p agenthold-server -- image build-dev
	$(CARGO) run -q -p agenthold-examples --bin quickstart

## test: everything CI checks. Installs and starts what the tests need (Docker engine, nftables, …).
## The order matters only for speed: the UI is built before the server that embeds it; install-check reuses
## the release build `python` made.
test: deps ui-test lint audit unit api-fuzz browser-test python install-check e2e

## deps-dev: what `make dev` needs (Docker, nftables, debootstrap); deps: that plus the test tools.
deps-dev:
	./scripts/ensure-deps.sh dev
deps:
	./scripts/ensure-deps.sh test

## lint: formatting, clippy, and docs/architecture.md's crate arrows and requirement map.
lint:
	$(CARGO) fmt --all -- --check
	./scripts/architecture-check.py
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p agenthold-core --all-targets --features sled -- -D warnings

## audit: known vulnerabilities in dependencies; unmaintained warnings are explained in
## docs/dependencies.md. Uses the offline RustSec snapshot in $(ADVISORY_DB) when it exists (beside our
## checkouts), cargo-audit's own database (fetched) otherwise.
audit:
	@command -v cargo-audit >/dev/null || $(CARGO) install cargo-audit --locked --quiet
	if [ -d "$(ADVISORY_DB)" ]; then $(CARGO) audit --db $(ADVISORY_DB) --no-fetch --stale; else $(CARGO) audit; fi

## unit: every Rust test, including the ones marked #[ignore] because they need root, Docker, nftables or
## PostgreSQL (the store's conformance and crash tests start a throwaway one), then the server's API tests
## again with every test server's state in PostgreSQL instead of the redb file.
unit: harness-image
	$(CARGO) test --workspace -- --include-ignored
	$(CARGO) test -p agenthold-core --features sled -- --include-ignored
	AGENTHOLD_TEST_SERVER_STORE=postgres $(CARGO) test -p agenthold-server --test integration -- --include-ignored serve::

## api-fuzz: schemathesis against a real server (scripts/api-fuzz.sh, about a minute): no 5xx, and every
## answer (status, content type, body) as /api/v1/openapi.json describes it. Uses the binary `unit` built.
api-fuzz: deps
	./scripts/api-fuzz.sh

## python: build the Python wheel (maturin, one abi3 wheel for CPython >= 3.9), install it into a fresh venv
## and run the pytest suite against real Docker. pytest's "no tests collected" (exit 5) fails the target.
## `make python MATURIN_FLAGS=` builds a debug wheel (much faster on a fresh target directory).
PYTHON ?= python3
MATURIN_VERSION ?= 1.16.0
PYTEST_VERSION ?= 9.2.0
MATURIN_FLAGS ?= --release
PY_DIR := target/python
python: deps
	$(CARGO) run -q -p agenthold-server -- image build-dev
	test -x $(PY_DIR)/tools/bin/maturin || { rm -rf $(PY_DIR)/tools && $(PYTHON) -m venv $(PY_DIR)/tools && \
	  $(PY_DIR)/tools/bin/pip install -q maturin==$(MATURIN_VERSION); }
	rm -rf $(PY_DIR)/wheels $(PY_DIR)/venv
	$(PY_DIR)/tools/bin/maturin build $(MATURIN_FLAGS) -m bindings/python/Cargo.toml -o $(PY_DIR)/wheels
	$(PYTHON) -m venv $(PY_DIR)/venv
	$(PY_DIR)/venv/bin/pip install -q pytest==$(PYTEST_VERSION) $(PY_DIR)/wheels/agenthold-*.whl
	$(PY_DIR)/venv/bin/python -m pytest -p no:cacheprovider bindings/python/tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make python: pytest collected no tests" >&2; exit 1; fi; exit $$rc

## install-check: README's install lines (cargo install, pip install, cargo add) on a clean prefix.
install-check: deps
	./scripts/install-check.sh

## e2e: the end-to-end egress check against the dev stack (E18); `make dev` first when run by hand.
e2e: deps
	$(CARGO) run -q -p agenthold-server -- image build-dev
	./scripts/e2e/egress.sh

## fuzz: run every fuzz target for FUZZ_SECONDS each (nightly toolchain, cargo-fuzz).
FUZZ_SECONDS ?= 60
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked --quiet
	for t in $$(cd fuzz && $(CARGO) +nightly fuzz list); do \
	  mkdir -p fuzz/corpus/$$t && $(CARGO) +nightly fuzz run $$t fuzz/corpus/$$t fuzz/seeds/$$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

## ui: build the web UI (agenthold-server/ui, Vite + Svelte) into agenthold-server/ui/dist, which the server
## embeds. Needs Node >= 20.19 and npm.
ui:
	cd agenthold-server/ui && npm ci --no-audit --no-fund && npm run build

## ui-test: the UI's type check (svelte-check, tsc), its unit tests (vitest), and that the typed client
## (src/lib/api/schema.d.ts) is the one generated from the committed OpenAPI document, which the Rust test
## openapi_snapshot keeps equal to the server's.
ui-test: ui
	cd agenthold-server/ui && npm run check && npm test
	cd agenthold-server/ui && gen=$$(mktemp --suffix=.d.ts) && npx openapi-typescript openapi.json -o "$$gen" >/dev/null && \
	  { cmp -s "$$gen" src/lib/api/schema.d.ts || { rm -f "$$gen"; echo "ui: schema.d.ts is stale: npm run gen" >&2; exit 1; }; } && rm -f "$$gen"

## browser-test: the web UI and the browser boundary (S6) in real Chromium (Debian's, driven by playwright-core)
## against a real `agenthold serve` with a real OIDC provider and a GitHub stand-in, all on loopback
## (agenthold-server/browser-tests). Needs the UI built into the debug binary. Two test files at a time
## (2 cores), every test and the whole run bounded. `make browser-test AGENTHOLD_SCREENSHOTS=docs/ui` also
## writes the screenshots of docs/ui.md.
BROWSER_TESTS := agenthold-server/browser-tests
BROWSER_TEST_TIMEOUT ?= 1500
browser-test: deps-dev ui
	test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	cd $(BROWSER_TESTS) && npm ci --no-audit --no-fund --loglevel=error
	$(CARGO) build -q -p agenthold-server
	$(CARGO) run -q -p agenthold-server -- image build-dev
	cd $(BROWSER_TESTS) && AGENTHOLD_BIN="$${CARGO_TARGET_DIR:-$(CURDIR)/target}/debug/agenthold" \
	  timeout $(BROWSER_TEST_TIMEOUT) node --test --test-concurrency=2 --test-timeout=300000 test/*.test.js

## bench: every benchmark (benches/README.md), then the plots of docs/benchmarks/ from their JSON. As root; installs
## what they need (Docker, nftables, wrk, nginx-light, curl, dnsmasq, python3-venv for mitmproxy) and builds the dev image.
## Takes about an hour (the soak alone 10 minutes); a bench that fails does not stop the others, the target
## fails at the end. `make bench-short` (or BENCH_SHORT=1 make bench): every bench in its quick mode
## (fewest rounds and seconds; the soak 1,000 connections for one minute), about 15 minutes. BENCHES=… picks.
BENCHES ?= egress intercept splice sandbox_start server store density soak
bench: bench-deps
	@failed=""; for b in $(BENCHES); do \
	  if [ ! -f benches/benches/$$b.rs ]; then echo "make bench: no bench $$b, skipped" >&2; continue; fi; \
	  echo "== bench $$b" >&2; \
	  $(CARGO) bench -q -p agenthold-benches --bench $$b || failed="$$failed $$b"; \
	done; \
	$(MAKE) --no-print-directory bench-report || failed="$$failed report"; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed" >&2; exit 1; fi
bench-short:
	BENCH_SHORT=1 $(MAKE) --no-print-directory bench

## bench-report: the SVG plots of docs/benchmarks/ from the bench JSON files in target/ (missing ones skipped).
bench-report:
	$(CARGO) bench -q -p agenthold-benches --bench report

## bench-deps: what the benches need besides what `make dev` installs.
bench-deps: deps-dev
	@need=""; \
	for t in wrk:wrk nginx:nginx-light curl:curl dnsmasq:dnsmasq-base; do command -v $${t%%:*} >/dev/null 2>&1 || need="$$need $${t#*:}"; done; \
	python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need="$$need python3-venv"; \
	compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || need="$$need postgresql"; \
	if [ -n "$$need" ]; then echo "bench-deps: installing$$need" >&2; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need >/dev/null; fi
	$(CARGO) run -q -p agenthold-server -- image build-dev
