#!/usr/bin/env bash
# Everything a reviewer runs: formatting, lints, docs, all tests, and the
# end-to-end checks with real clients where this machine has them.
# usage: ./verify.sh [--install]
#   --install: first install what the checks need (tests/packages, and the
#   macOS target for the cross-check): as root, with apt-get and rustup; as
#   a user, name in one line what is missing and the command that installs
#   it, then run what can run.
set -euo pipefail
cd "$(dirname "$0")"

install() {
	local packages missing
	packages=$(sed 's/#.*//' tests/packages | xargs)
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		# shellcheck disable=SC2086
		apt-get install -y -qq --no-install-recommends $packages >/dev/null
	else
		missing=$(for p in $packages; do
			dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"
		done | xargs)
		[[ -z $missing ]] || echo "verify: missing: $missing; install them with: sudo apt-get install -y --no-install-recommends $missing"
	fi
	if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx x86_64-apple-darwin; then
		rustup target add x86_64-apple-darwin >/dev/null ||
			echo "verify: rustup could not add x86_64-apple-darwin: the macOS build check will say SKIPPED"
	fi
}
case ${1:-} in
--install)
	install
	# A fresh machine builds once: incremental caches would only take disk.
	export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
	;;
"") ;;
-h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
*) echo "usage: ./verify.sh [--install]" >&2; exit 2 ;;
esac

step() { printf '\n== %s\n' "$*"; }
source tests/skip.sh

# Every check runs, and the last lines say how each went: the names of the
# checks that were skipped, then `verify: N passed, N failed, N skipped`.
# Skips are collected from the scripts and the Rust tests (tests/skip.sh,
# layerfs_testkit::skipped) through this file.
mkdir -p target
# A full run builds about 4 GB under target/ (3.7 GB measured: debug,
# release, the macOS check) and makes sparse disk images under /tmp: say
# so before a full disk fails a link step with a bus error.
free_gb=$(df -P -BG target | awk 'NR == 2 { sub("G", "", $4); print $4 }')
if ((free_gb < 8)); then
	echo "verify: only ${free_gb} GB free for target/; a full run needs about 8 GB"
fi
export LAYERFS_SKIPS=$PWD/target/verify-skips
: >"$LAYERFS_SKIPS"
: >target/verify-times
passed=0
failed=()
check() { # check NAME COMMAND...: a command that is one check
	local name=$1 skips started=$SECONDS
	shift
	skips=$(wc -l <"$LAYERFS_SKIPS")
	if ! "$@"; then
		echo "FAILED: $name"
		failed+=("$name")
	elif [[ $(wc -l <"$LAYERFS_SKIPS") == "$skips" ]]; then
		passed=$((passed + 1))
	fi
	# Where a run's time goes (CI has 90 minutes): each check's, in one place.
	echo "$((SECONDS - started)) s: $name" >>target/verify-times
	# A command that said SKIPPED for itself or any of its parts (adding
	# their names to the list) and exited 0 is counted under skipped, by
	# those names, and not as passed too.
}
missing() { # missing NAME WHY: a check whose tools are not here
	if [[ ${LAYERFS_REQUIRE_MOUNTS:-} == 1 ]]; then
		echo "FAILED: $1: $2"
		failed+=("$1")
	else
		skipped "$1" "$2"
	fi
}
summary() {
	local skips
	skips=$(sort -u "$LAYERFS_SKIPS" | paste -sd ';' | sed 's/;/; /g')
	echo
	[[ ${#failed[@]} == 0 ]] || printf 'failed: %s\n' "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
	echo "slowest checks: $(sort -rn target/verify-times | head -n 8 | paste -sd ';' | sed 's/;/; /g')"
	echo "skipped: ${skips:-none}"
	echo "verify: $passed passed, ${#failed[@]} failed, $(sort -u "$LAYERFS_SKIPS" | grep -c .) skipped"
}

# As root, tests that mount (a full tmpfs, overlays across filesystems, the
# overlayfs differential, FUSE) must run: a failed mount fails them, not
# SKIPPED.
if [ "$(id -u)" = 0 ]; then
	export LAYERFS_REQUIRE_MOUNTS=1
	# Users who are not root mount FUSE through fusermount3, which opens
	# /dev/fuse as them: where it is closed to them (0600), it is opened for
	# this run and put back after.
	if [[ -c /dev/fuse && $(stat -c %a /dev/fuse) != 666 ]]; then
		fuse_mode=$(stat -c %a /dev/fuse)
		chmod 666 /dev/fuse
		trap 'chmod "$fuse_mode" /dev/fuse' EXIT
	fi
fi

step "cargo fmt --check"
check "cargo fmt" cargo fmt --all -- --check

step "cargo clippy -D warnings"
check "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings

# The server also runs on macOS: its platform code (the socket owner check,
# mode_t and dev_t widths, no syncfs) must at least build and lint there.
# blake3 would assemble with a macOS C compiler; its pure-Rust build is used
# for this check (CARGO_FEATURE_PURE), in a target directory of its own.
step "cargo clippy for macOS (x86_64-apple-darwin)"
if rustup target list --installed 2>/dev/null | grep -qx x86_64-apple-darwin; then
	check "cargo clippy for macOS" env CARGO_FEATURE_PURE=1 CARGO_TARGET_DIR=target/macos-check \
		cargo clippy --workspace --target x86_64-apple-darwin -- -D warnings
else
	skipped "cargo clippy for macOS" "the macOS target is not installed (rustup target add x86_64-apple-darwin)"
fi

# The fuzz targets are a workspace of their own that cargo test never
# builds: checked here so that a change to the crates they drive cannot
# leave tools/fuzz/run broken.
step "cargo check: the fuzz targets"
check "cargo check: the fuzz targets" cargo check --manifest-path fuzz/Cargo.toml --bins --quiet

step "cargo doc"
check "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo test"
check "cargo test" cargo test --workspace

# Needs root and overlayfs (and /dev/fuse through FUSE); says SKIPPED where
# they are missing.
for door in trait fuse; do
	step "the layered filesystem against overlayfs: 2,000 random sequences as root and 300 as a user, through the $door"
	log=target/overlay-diff-$door.log
	skips=$(wc -l <"$LAYERFS_SKIPS")
	if LAYERFS_DIFF_DOOR=$door LAYERFS_DIFF_CASES=2000 LAYERFS_DIFF_USER_CASES=300 \
		cargo test -p layerfs-layers --test overlay_diff -- --nocapture >$log 2>&1; then
		[[ $(wc -l <"$LAYERFS_SKIPS") == "$skips" ]] && passed=$((passed + 1))
		grep -E 'SKIPPED|succeeded|test result' $log
	else
		# The failing case and why, without the backtrace.
		grep -E -A 12 'panicked at|Test failed|minimal failing' $log | grep -v '^ *[0-9]*: \|^ *at ' | head -n 60
		failed+=("overlay differential through the $door")
	fi
done

step "end to end: libnfs client"
cargo build --release -p layerfs-cli
if command -v nfs-cp >/dev/null; then
	check "libnfs round trip" tests/libnfs.sh target/release/layerfs
else
	missing "libnfs round trip" "libnfs-utils is not installed (apt-get install libnfs-utils)"
fi

step "end to end: the Linux kernel FUSE client (native)"
# Needs root and /dev/fuse; each run says SKIPPED where they are missing.
# On btrfs the flat run also serves a subvolume inside the export.
for on in tmpfs ext4 xfs btrfs; do
	for what in flat stack; do
		echo "-- workload through FUSE, $what, on $on"
		check "FUSE $what on $on" tests/fuse/run.sh target/release/layerfs $what $on
	done
done
echo "-- workload through FUSE, flat, on an overlay across filesystems"
check "FUSE flat on an overlay" tests/fuse/run.sh target/release/layerfs flat overlay
# A door not run as root has no passthrough: every read and write is a
# request to it.
for what in flat stack; do
	echo "-- workload through FUSE without passthrough, $what, on ext4"
	check "FUSE $what on ext4 without passthrough" tests/fuse/run.sh target/release/layerfs $what ext4 no-passthrough
done
echo "-- permissions of non-root callers through FUSE, with passthrough and without"
check "FUSE permissions" tests/fuse/run.sh target/release/layerfs permissions tmpfs
check "FUSE permissions without passthrough" tests/fuse/run.sh target/release/layerfs permissions tmpfs no-passthrough
# FUSE over io_uring (Linux 6.14): SKIPPED where the kernel has no such
# parameter; each run fails unless the rings answered its requests.
for what in flat stack permissions; do
	echo "-- $what through FUSE over io_uring"
	check "FUSE $what through io_uring" tests/fuse/run.sh target/release/layerfs $what tmpfs io-uring
done
echo "-- pjdfstest (POSIX conformance, mostly as non-root callers) through FUSE"
check "pjdfstest flat" tests/fuse/pjdfstest.sh target/release/layerfs flat no-passthrough
check "pjdfstest stack" tests/fuse/pjdfstest.sh target/release/layerfs stack
check "pjdfstest stack through io_uring" tests/fuse/pjdfstest.sh target/release/layerfs stack io-uring
echo "-- starting and stopping the door"
check "FUSE door" tests/fuse/door.sh target/release/layerfs
echo "-- extended attributes and file capabilities through the door"
check "FUSE extended attributes" tests/fuse/xattrs.sh target/release/layerfs
echo "-- read-only directories under a door and a daemon run by a user"
check "FUSE read-only directories" tests/fuse/readonly.sh target/release/layerfs
echo "-- git, make, sqlite3, mmap, flock and tar through the door, as root and as a user"
check "programs through FUSE" tests/fuse/programs.sh target/release/layerfs
echo "-- the workspace daemon through FUSE: import, create, mount, reset, a size limit, commit"
check "daemon through FUSE" tests/daemon/fuse.sh target/release/layerfs
echo "-- the daemon's mounts on its rings (--io-uring): twenty mounts, a kill -9, requests made meanwhile"
check "daemon through FUSE over io_uring" tests/daemon/fuse.sh target/release/layerfs io-uring
echo "-- the daemon killed -9 under a reader, a writer and held files; an upgrade; SIGTERM"
check "daemon's takeovers through FUSE" tests/daemon/takeover.sh target/release/layerfs
echo "-- layerfs demo, and a user's own daemon through fusermount3"
check "demo and a user's daemon" tests/daemon/user.sh target/release/layerfs
echo "-- 16 clients on workspaces of their own for 90 s, each step checked"
check "daemon under many clients" tests/daemon/soak.sh target/release/layerfs 90 16
echo "-- the daemon as a service: the units, readiness, SIGUSR1's hand-over, SIGTERM"
check "daemon as a service" tests/daemon/service.sh target/release/layerfs
echo "-- the daemon killed at every step: 50 cycles of kill -9 under a writer and requests in flight"
check "daemon killed at every step" tests/daemon/crash.sh target/release/layerfs 50
echo "-- images from a registry: docker-registry on 127.0.0.1, umoci and skopeo to compare"
check "registry pulls" tests/registry/pull.sh target/release/layerfs
check "registry pushes" tests/registry/push.sh target/release/layerfs
check "pulls when the registry or the disk fails" tests/registry/outages.sh target/release/layerfs
check "lazy pulls" tests/registry/lazy.sh target/release/layerfs
check "a lazy layer's life" tests/registry/lazy-lifecycle.sh target/release/layerfs
check "lazy pulls of converters' images" tests/registry/converters.sh target/release/layerfs
check "podman reads layerfs's lazy images" tests/registry/podman.sh target/release/layerfs

step "end to end: the Linux kernel NFSv3 client (QEMU)"
if command -v qemu-system-x86_64 >/dev/null && command -v busybox >/dev/null; then
	kc() { tools/kernel-client/run --port 20490 --timeout 900 "$@"; }
	serve() { echo "exec $PWD/tests/kernel/serve.sh $PWD/target/release/layerfs 20490 $*"; }
	# As Linux mounts by default (1 MiB transfers, READDIRPLUS), on a fresh
	# tmpfs, on the guest's /tmp (an overlay across 9p and tmpfs, which
	# renumbers directories) and on ext4.
	for on in tmpfs overlay ext4; do
		echo "-- workload, export on $on"
		check "kernel client workload on $on" kc --server "$(serve $on)" --workload tests/kernel/workload.sh
	done
	# As macOS mounts: 32 KiB transfers and plain READDIR.
	echo "-- workload with macOS' transfer sizes, export on tmpfs"
	check "kernel client with macOS' sizes" kc --server "$(serve tmpfs)" --workload tests/kernel/workload.sh \
		--opts rsize=32768,wsize=32768,nordirplus
	# Callers who are not root, against the guest's own tmpfs.
	echo "-- permissions of non-root callers"
	check "kernel client permissions" kc --server "$(serve tmpfs)" --workload tests/kernel/permissions.sh
	# A three-layer workspace: the layers' own checks, then the same
	# workload. (A stack on the guest's /tmp is refused at start: its
	# filesystem does not keep inode numbers.)
	for on in tmpfs ext4; do
		echo "-- three-layer workspace on $on"
		check "kernel client three layers on $on" kc --server "$(serve $on stack)" --workload tests/kernel/layered.sh
	done
	# The daemon serves and mounts the workspaces itself; killed with -9
	# under a writer and started again, the writer finishes.
	echo "-- the workspace daemon over NFS: a kill -9 under a writer and a restart"
	check "kernel client daemon" kc --no-mount --workload tests/kernel/daemon.sh \
		--server "exec $PWD/target/release/layerfs daemon --store /run/lfs-store --nfs-port 20490"
	echo "-- the daemon killed at every step over NFS: 6 cycles (each about 50 s under TCG)"
	check "kernel client crash cycles" kc --no-mount --workload tests/kernel/crash.sh \
		--server "exec $PWD/target/release/layerfs daemon --store /run/lfs-kc-store --nfs-port 20490"
	echo "-- lazy pull over NFS: zstd:chunked and eStargz read at first read, a corrupted piece, a registry gone, ctr-remote's images"
	check "kernel client lazy pulls" kc --no-mount --workload tests/kernel/lazy.sh \
		--server "exec $PWD/target/release/layerfs daemon --store /run/lfs-store --nfs-port 20490"
	echo "-- fifty workspaces of one daemon mounted over NFS at once"
	check "kernel client fifty workspaces" kc --no-mount --workload tests/kernel/many.sh \
		--server "exec $PWD/target/release/layerfs daemon --store /run/lfs-store --nfs-port 20490"
else
	missing "the Linux kernel NFS client (QEMU)" "QEMU is not installed (apt-get install qemu-system-x86 busybox-static xz-utils)"
fi

summary
[[ ${#failed[@]} == 0 ]]
