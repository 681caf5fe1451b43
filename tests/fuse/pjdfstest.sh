#!/usr/bin/env bash
# pjdfstest, the POSIX filesystem conformance suite (8,798 checks of chmod,
# chown, link, mkdir, mkfifo, open, rename, rmdir, symlink, truncate, unlink
# and utimensat, most of them as users other than root), through a FUSE
# mount of a fresh tmpfs directory: flat, or as a stack over one empty
# layer. The door runs as root and serves every user (--allow-other), as the
# suite switches users. Every check must pass: on a tmpfs directory itself
# they all do.
#
# Builds pjdfstest at a pinned commit into target/pjdfstest the first time
# (a C compiler, autoconf, automake, make, and prove from perl), from
# $PJDFSTEST_TARBALL or ../shared/third_party/pjdfstest-85a8aea.tar.gz beside
# the repository where present (its sha256 checked), else fetched from GitHub
# with git. Needs root and /dev/fuse; says SKIPPED without them, or fails
# instead with LAYERFS_REQUIRE_MOUNTS=1 (a suite that cannot be had at all
# is SKIPPED either way).
# With `io-uring` the door takes requests through FUSE over io_uring (the fuse
# module's enable_uring set for the run, and put back after).
# usage: tests/fuse/pjdfstest.sh LAYERFS (flat|stack) [no-passthrough|io-uring]
set -euo pipefail
layerfs=$(realpath "$1") what=$2 passthrough=${3:-passthrough}
repo=$(cd "$(dirname "$0")/../.." && pwd)
commit=85a8aea9e685999ef0540392fd80535f873d7ff7
suite=$repo/target/pjdfstest
tarball=${PJDFSTEST_TARBALL:-$repo/../shared/third_party/pjdfstest-85a8aea.tar.gz}
tarball_sha256=04a4b6b0971c79c1961545ccec8ecda186d1243181627a79aaa640b788def098
source "$repo/tests/skip.sh"
check="pjdfstest through FUSE ($what, $passthrough)"
skip() {
	skip_or_fail "$check" "$*"
	exit 0
}
# The suite's source is not this project's: where neither the tarball nor
# GitHub can be had, the check is skipped whatever the policy, and says so.
unavailable() {
	skipped "$check" "$*"
	exit 0
}
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ $(id -u) == 0 ]] || skip "needs root (the suite switches users)"
for tool in cc autoreconf make prove; do
	command -v $tool >/dev/null || skip "$tool is missing (apt-get install gcc autoconf automake make perl)"
done
if [[ ! -x $suite/pjdfstest ]]; then
	rm -rf "$suite"
	mkdir -p "$suite"
	if [[ -f $tarball ]]; then
		got=$(sha256sum <"$tarball" | cut -d' ' -f1)
		[[ $got == "$tarball_sha256" ]] || {
			echo "FAILED: $tarball has sha256 $got, not $tarball_sha256"
			exit 1
		}
		tar -xzf "$tarball" -C "$suite" --strip-components=1
	else
		command -v git >/dev/null || skip "no $tarball, and git is missing to fetch the suite (apt-get install git)"
		(
			cd "$suite"
			git init -q
			timeout 120 git fetch -q --depth 1 https://github.com/pjd/pjdfstest "$commit" &&
				git checkout -q FETCH_HEAD
		) || {
			rm -rf "$suite"
			unavailable "no $tarball, and pjdfstest $commit could not be fetched from GitHub"
		}
	fi
	(cd "$suite" && autoreconf -ifs && ./configure -q && make -s pjdfstest) >"$suite.build.log" 2>&1 || {
		tail -n 20 "$suite.build.log"
		echo "pjdfstest did not build"
		exit 1
	}
fi

base=$(mktemp -d /tmp/layerfs-pjdfstest.XXXXXX)
mount -t tmpfs -o size=512m tmpfs "$base"
mnt=$base/mnt
mkdir "$mnt"
cleanup() {
	cd /
	pkill -f -- "serve --fuse $mnt" || true
	umount -l "$mnt" 2>/dev/null || true
	umount -l "$base"
	rmdir "$base"
	if [[ -n ${uring_was:-} ]]; then echo "$uring_was" >"$uring_param"; fi
}
trap cleanup EXIT
flags=(--allow-other)
[[ $passthrough == no-passthrough ]] && flags+=(--no-passthrough)
uring_param=/sys/module/fuse/parameters/enable_uring
if [[ $passthrough == io-uring ]]; then
	[[ -w $uring_param ]] || skip "this kernel has no FUSE over io_uring ($uring_param)"
	uring_was=$(cat "$uring_param")
	echo Y >"$uring_param"
	flags+=(--io-uring)
fi
case $what in
flat)
	mkdir "$base/dir"
	"$layerfs" serve --fuse "$mnt" "${flags[@]}" "$base/dir" >"$base/door.log" 2>&1 &
	;;
stack)
	mkdir "$base/lower"
	"$layerfs" serve --fuse "$mnt" "${flags[@]}" --layer "$base/lower" --upper "$base/upper" \
		>"$base/door.log" 2>&1 &
	;;
*)
	echo "usage: $0 LAYERFS (flat|stack) [no-passthrough|io-uring]" >&2
	exit 2
	;;
esac
door=$!
fuse_mounted() { awk -v m="$mnt" '$2 == m && $3 ~ /^fuse/ {f=1} END {exit !f}' /proc/mounts; }
for _ in $(seq 100); do
	fuse_mounted && break
	sleep 0.1
done
# Without the mount the suite would run in the plain tmpfs directory, and pass.
if ! fuse_mounted || ! kill -0 $door 2>/dev/null; then
	tail -n 20 "$base/door.log"
	echo "FAILED: the door never mounted $mnt"
	exit 1
fi
# Through the rings, or not at all: the door says which once set up.
if [[ $passthrough == io-uring ]]; then
	for _ in $(seq 50); do
		grep -q "through FUSE over io_uring" "$base/door.log" && break
		sleep 0.1
	done
	if ! grep -q "through FUSE over io_uring" "$base/door.log"; then
		tail -n 20 "$base/door.log"
		echo "FAILED: the door did not set up its rings"
		exit 1
	fi
fi
# The suite's users (65531-65535) walk into the mount from here.
chmod 755 "$base"
cd "$mnt"
suite_ok=yes
prove -r "$suite/tests" >"$base/prove.log" 2>&1 || suite_ok=no
# Through the rings, or not at all: each ring logs the requests it was
# given at each power of ten; the suite makes tens of thousands.
if [[ $passthrough == io-uring ]]; then
	given=$(sed -n 's/.*FUSE ring of CPU [0-9]* has been given \([0-9]*\) requests.*/\1/p' "$base/door.log" | sort -n | tail -1)
	echo "the busiest ring was given ${given:-no} requests (to the nearest power of ten below)"
	if ((${given:-0} < 1000)); then
		tail -n 20 "$base/door.log"
		echo "FAILED: the rings answered next to nothing: requests came through /dev/fuse"
		exit 1
	fi
fi
if ! fuse_mounted || ! kill -0 $door 2>/dev/null; then
	tail -n 20 "$base/door.log"
	echo "FAILED: the door or its mount was gone by the end of the suite"
	exit 1
fi
if [[ $suite_ok == no ]]; then
	grep -v ' ok$' "$base/prove.log" | head -n 60
	echo "-- door log:"
	tail -n 20 "$base/door.log"
	echo "pjdfstest failed through FUSE ($what, $passthrough)"
	exit 1
fi
tail -n 2 "$base/prove.log"
echo "pjdfstest passed through FUSE ($what, $passthrough)"
