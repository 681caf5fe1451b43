#!/usr/bin/env bash
# pjdfstest, the POSIX filesystem conformance suite (8,798 checks of chmod,
# chown, link, mkdir, mkfifo, open, rename, rmdir, symlink, truncate, unlink
# and utimensat, most of them as users other than root), through a FUSE
# mount of a fresh tmpfs directory: flat, or as a stack over one empty
# layer. The door runs as root and serves every user (--allow-other), as the
# suite switches users. Every check must pass: on a tmpfs directory itself
# they all do.
#
# Fetches pjdfstest at a pinned commit into target/pjdfstest the first time
# and builds it (git, a C compiler, autoconf, automake, make, and prove from
# perl). Needs root and /dev/fuse; says SKIPPED without them.
# usage: tests/fuse/pjdfstest.sh LAYERFS (flat|stack) [no-passthrough]
set -euo pipefail
layerfs=$(realpath "$1") what=$2 passthrough=${3:-passthrough}
repo=$(cd "$(dirname "$0")/../.." && pwd)
commit=85a8aea9e685999ef0540392fd80535f873d7ff7
suite=$repo/target/pjdfstest
skip() {
	echo "SKIPPED: pjdfstest through FUSE: $*"
	exit 0
}
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ $(id -u) == 0 ]] || skip "needs root (the suite switches users)"
for tool in git cc autoreconf make prove; do
	command -v $tool >/dev/null || skip "$tool is missing (apt-get install git gcc autoconf automake make perl)"
done
if [[ ! -x $suite/pjdfstest ]]; then
	rm -rf "$suite"
	mkdir -p "$suite"
	(
		cd "$suite"
		git init -q
		timeout 120 git fetch -q --depth 1 https://github.com/pjd/pjdfstest "$commit" &&
			git checkout -q FETCH_HEAD
	) || {
		rm -rf "$suite"
		skip "could not fetch pjdfstest $commit from GitHub"
	}
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
}
trap cleanup EXIT
flags=(--allow-other)
[[ $passthrough == no-passthrough ]] && flags+=(--no-passthrough)
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
	echo "usage: $0 LAYERFS (flat|stack) [no-passthrough]" >&2
	exit 2
	;;
esac
for _ in $(seq 100); do
	awk -v m="$mnt" '$2 == m {f=1} END {exit !f}' /proc/mounts && break
	sleep 0.1
done
# The suite's users (65531-65535) walk into the mount from here.
chmod 755 "$base"
cd "$mnt"
if ! prove -r "$suite/tests" >"$base/prove.log" 2>&1; then
	grep -v ' ok$' "$base/prove.log" | head -n 60
	echo "-- door log:"
	tail -n 20 "$base/door.log"
	echo "pjdfstest failed through FUSE ($what, $passthrough)"
	exit 1
fi
tail -n 2 "$base/prove.log"
echo "pjdfstest passed through FUSE ($what, $passthrough)"
