#!/usr/bin/env bash
# Everything a reviewer runs: formatting, lints, docs, all tests, and the
# end-to-end checks with real clients where this machine has them.
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n== %s\n' "$*"; }

# As root, tests that mount (a full tmpfs, overlays across filesystems, the
# overlayfs differential) must run: a failed mount fails them, not SKIPPED.
if [ "$(id -u)" = 0 ]; then
	export LAYERFS_REQUIRE_MOUNTS=1
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo test"
cargo test --workspace

step "the layered filesystem against overlayfs: 2,000 random sequences"
# Needs root and overlayfs; says SKIPPED where they are missing.
log=target/overlay-diff.log
if ! LAYERFS_DIFF_CASES=2000 cargo test -p layerfs-layers --test overlay_diff -- --nocapture >$log 2>&1; then
	grep -v '^thread\|^called\|^$' $log | tail -n 40
	exit 1
fi
grep -E 'SKIPPED|succeeded|test result' $log

step "end to end: libnfs client"
cargo build --release -p layerfs-cli
if command -v nfs-cp >/dev/null; then
	tests/libnfs.sh target/release/layerfs
else
	echo "SKIPPED: libnfs-utils is not installed (apt-get install libnfs-utils)"
fi

step "end to end: the Linux kernel NFSv3 client (QEMU)"
if command -v qemu-system-x86_64 >/dev/null && command -v busybox >/dev/null; then
	serve="mkdir -p /run/export && exec $PWD/target/release/layerfs serve --listen 127.0.0.1:20490 /run/export"
	# As Linux mounts by default: 1 MiB transfers, READDIRPLUS.
	tools/kernel-client/run --server "$serve" --port 20490 --workload tests/kernel/workload.sh --timeout 900
	# As macOS mounts: 32 KiB transfers and plain READDIR.
	tools/kernel-client/run --server "$serve" --port 20490 --workload tests/kernel/workload.sh --timeout 900 \
		--opts rsize=32768,wsize=32768,nordirplus
	# A three-layer workspace: the layers' own checks, then the same workload.
	tools/kernel-client/run --server "exec $PWD/tests/kernel/stack.sh $PWD/target/release/layerfs 20490" \
		--port 20490 --workload tests/kernel/layered.sh --timeout 900
else
	echo "SKIPPED: QEMU is not installed (apt-get install qemu-system-x86 busybox-static xz-utils)"
fi
