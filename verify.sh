#!/usr/bin/env bash
# Everything a reviewer runs: formatting, lints, docs, all tests, and the
# end-to-end checks with real clients where this machine has them.
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo test"
cargo test --workspace
