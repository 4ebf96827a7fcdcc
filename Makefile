# agenthold: the two commands a new machine needs are `make dev` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
ADVISORY_DB ?= ../shared/advisory-db

.PHONY: dev test deps lint audit unit fuzz

## dev: run the quickstart on the embedded default: a Runtime, one sandbox with an allowlist and a secret,
## a command against a local upstream, and the request log. Builds the dev image once (about a minute).
dev: deps
	$(CARGO) run -q -p agenthold-server -- image build-dev
	$(CARGO) run -q -p agenthold-examples --bin quickstart

## test: everything CI checks. Installs and starts what the tests need (Docker engine, nftables, …).
test: deps lint audit unit

deps:
	./scripts/ensure-deps.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p agenthold-core --all-targets --features sled -- -D warnings

## audit: known vulnerabilities in dependencies (offline RustSec snapshot); unmaintained warnings are
## explained in docs/dependencies.md.
audit:
	@command -v cargo-audit >/dev/null || $(CARGO) install cargo-audit --locked --quiet
	$(CARGO) audit --db $(ADVISORY_DB) --no-fetch --stale

## unit: every Rust test, including the ones marked #[ignore] because they need root, Docker or nftables.
unit:
	$(CARGO) test --workspace -- --include-ignored
	$(CARGO) test -p agenthold-core --features sled -- --include-ignored

## fuzz: run every fuzz target for FUZZ_SECONDS each (nightly toolchain, cargo-fuzz).
FUZZ_SECONDS ?= 60
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked --quiet
	for t in $$(cd fuzz && $(CARGO) +nightly fuzz list); do \
	  mkdir -p fuzz/corpus/$$t && $(CARGO) +nightly fuzz run $$t fuzz/corpus/$$t fuzz/seeds/$$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done
