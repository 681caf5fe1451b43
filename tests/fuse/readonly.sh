#!/usr/bin/env bash
# Read-only directories under a door and a daemon run by a user who is not
# root (no CAP_DAC_OVERRIDE): the user may change the files in a directory
# of mode 0555, as on any filesystem, so the copy-ups, markers and resets
# those changes need must still happen in the upper. The same operations
# run as the user on the mount and on a plain copy of the lower (what Linux
# itself does) must end alike; the upper must keep every directory's exact
# mode; the daemon's reset and commit must work over such directories.
# Needs root (to become the user), /dev/fuse open to users and fusermount3;
# says SKIPPED without them (tests/skip.sh).
# usage: tests/fuse/readonly.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
source "$(dirname "$0")/../lib.sh"
name="FUSE read-only directories served by a user"
if [[ ! -c /dev/fuse || $(id -u) != 0 ]]; then
	skip_or_fail "$name" "needs root and /dev/fuse"
	exit 0
fi
if ! command -v fusermount3 >/dev/null; then
	skip_or_fail "$name" "fusermount3 is not installed (apt-get install fuse3)"
	exit 0
fi
if ! setpriv --reuid=65534 --regid=65534 --clear-groups test -r /dev/fuse -a -w /dev/fuse; then
	skip_or_fail "$name" "/dev/fuse is not open to users (chmod 666 /dev/fuse)"
	exit 0
fi
t=$(mktemp -d /tmp/layerfs-readonly.XXXXXX)
chmod 755 "$t"
daemon=
cleanup() {
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	unmount_under "$t"
	chmod -R u+rwx "$t" 2>/dev/null || true
	rm -rf "$t"
}
trap cleanup EXIT
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$t" "$@"; }

# A tree of read-only directories, some nested, some holding others.
tree() {
	mkdir -p "$1/e/sub/deep" "$1/w/r/s" "$1/z"
	echo in >"$1/e/g"
	echo x >"$1/e/h"
	echo k >"$1/e/sub/k"
	echo f >"$1/w/r/s/f"
	echo old >"$1/z/old"
	echo t >"$1/e/t"
	ln -s g "$1/e/link"
	ln "$1/e/h" "$1/e/sub/h2"
	chmod 555 "$1/e/sub/deep" "$1/e/sub" "$1/e" "$1/w/r/s" "$1/w/r"
}
tree "$t/lower"
tree "$t/plain"
mkdir "$t/upper" "$t/m"
chown -R 65534:65534 "$t"

# What the user does, with each exit status and the tree it leaves.
changes() (
	set +e
	d=$1
	as_nobody sh -c "echo more >>$d/e/g && sync $d/e/g"; echo "append in a read-only directory: $?"
	as_nobody touch "$d/e/h"; echo "touch in a read-only directory: $?"
	as_nobody sh -c "echo more >>$d/e/sub/k && sync $d/e/sub/k"; echo "append two read-only directories down: $?"
	as_nobody mv "$d/w" "$d/w2"; echo "rename of a directory holding read-only ones: $?"
	as_nobody sh -c "echo more >>$d/w2/r/s/f && sync $d/w2/r/s/f"; echo "append after it: $?"
	as_nobody rm -r "$d/z"
	as_nobody mkdir -m 555 "$d/z"; echo "mkdir -m 555 over a removed lower directory: $?"
	as_nobody chmod 755 "$d/e/sub/deep"; echo "chmod of a read-only lower directory: $?"
	as_nobody touch -h "$d/e/link"; echo "touch -h of a symlink in a read-only directory: $?"
	as_nobody chmod 600 "$d/e/sub/h2"; echo "chmod of a file linked from two read-only directories: $?"
	as_nobody truncate -s 1 "$d/e/t"; echo "truncate in a read-only directory: $?"
	as_nobody rm "$d/e/h" 2>/dev/null; echo "rm in a read-only directory (refused): $?"
	# (A merged directory counts one link, as on overlayfs: not compared.)
	as_nobody sh -c "cd $d && find . -type d -printf '%p %M\n' | sort &&
		find . ! -type d -printf '%p %M %s %n\n' | sort && cat e/g e/h e/sub/k w2/r/s/f e/t"
)

as_nobody "$layerfs" serve --fuse "$t/m" --layer "$t/lower" --upper "$t/upper" >"$t/serve.log" 2>&1 &
for _ in $(seq 100); do mounted "$t/m" && break; sleep 0.1; done
mounted "$t/m" || fail "not mounted by the user: $(cat "$t/serve.log")"
changes "$t/plain" >"$t/want" 2>&1 || true
{ changes "$t/m" 2>&1 || true; } | sed "s|$t/m|$t/plain|g" >"$t/got"
diff -u "$t/want" "$t/got" || fail "the mount and Linux itself differ (above: - Linux, + the mount)"
fusermount3 -u "$t/m"
# Durable in the upper, with each directory's exact mode.
for want in "e 555" "e/sub 555" "e/sub/deep 755" "w2/r 555" "w2/r/s 555" "z 555"; do
	set -- $want
	got=$(stat -c %a "$t/upper/$1") || fail "the upper lacks $1"
	[[ $got == "$2" ]] || fail "upper $1 has mode $got, not $2 (a lent write permission kept?)"
done
[[ $(cat "$t/upper/e/g" "$t/upper/w2/r/s/f") == "$(printf 'in\nmore\nf\nmore')" ]] ||
	fail "the appends did not reach the upper"
echo "the mount as the user: the same as Linux"

# The daemon as the user: reset (one path, then all) and commit over the
# same read-only directories.
export XDG_RUNTIME_DIR=$t/run LAYERFS_STORE=$t/store
mkdir -m 700 "$t/run" "$t/ws"
chown 65534:65534 "$t/run" "$t/ws"
coproc DAEMON { exec setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$t" \
	XDG_RUNTIME_DIR="$t/run" LAYERFS_STORE="$t/store" "$layerfs" daemon 2>"$t/daemon.log"; }
daemon=$DAEMON_PID
read -r -t 30 _ <&"${DAEMON[0]}" || fail "the user's daemon never said it was ready: $(cat "$t/daemon.log")"
layer=$(as_nobody "$layerfs" layer import "$t/lower") || fail "import"
as_nobody "$layerfs" create ro --from "$layer" >/dev/null
as_nobody "$layerfs" mount ro "$t/ws" >/dev/null || fail "the user's mount"
as_nobody sh -c "echo one >>$t/ws/e/g && echo two >>$t/ws/e/sub/k" || fail "appends in the workspace"
as_nobody "$layerfs" reset ro e/g >/dev/null || fail "reset of a file in a read-only directory: $(tail -3 "$t/daemon.log")"
[[ $(as_nobody cat "$t/ws/e/g") == in ]] || fail "e/g was not reset"
[[ $(as_nobody cat "$t/ws/e/sub/k") == "$(printf 'k\ntwo')" ]] || fail "the reset of e/g changed e/sub/k"
as_nobody "$layerfs" reset ro >/dev/null || fail "reset of a workspace with read-only directories"
[[ $(as_nobody cat "$t/ws/e/sub/k") == k ]] || fail "e/sub/k was not reset"
as_nobody sh -c "echo three >>$t/ws/e/sub/k"
as_nobody "$layerfs" commit ro >/dev/null || fail "commit"
as_nobody sh -c "echo four >>$t/ws/e/sub/k"
[[ $(as_nobody cat "$t/ws/e/sub/k") == "$(printf 'k\nthree\nfour')" ]] || fail "the append after the commit"
changed=$(as_nobody "$layerfs" diff ro)
[[ $changed == "C /e/sub/k "* && $(wc -l <<<"$changed") == 1 ]] || fail "diff after the commit: $changed"
as_nobody "$layerfs" unmount ro >/dev/null
as_nobody "$layerfs" rm ro >/dev/null || fail "rm of the workspace"
echo "the daemon as the user: reset and commit"
echo "FUSE read-only directories: ok"
