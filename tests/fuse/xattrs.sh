#!/usr/bin/env bash
# Extended attributes through the FUSE door over a layered workspace, as
# kernel overlayfs keeps them: a lower file's user. attribute reads, a set
# copies the file up with the attributes it had (the layer keeps its own),
# a remove takes one away from the workspace only, a whiteout hides them
# with the file, system. names are not served. A file capability
# (security.capability) in a layer shows as getcap would read it, and a
# write by a user who is not root takes it away, as Linux does, while the
# layer keeps it; the kernel looks for one before the first write to a
# file, and the door answers later looks from memory (one host call for
# 2,000 writes). A door run by a user copies up a read-only file with its
# attributes, and a file with a capability without it.
# Needs root and /dev/fuse; says SKIPPED without them (tests/skip.sh).
# usage: tests/fuse/xattrs.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
source "$(dirname "$0")/../lib.sh"
if [[ ! -c /dev/fuse || $(id -u) != 0 ]]; then
	skip_or_fail "FUSE extended attributes" "need root and /dev/fuse"
	exit 0
fi
t=$(mktemp -d /tmp/layerfs-xattrs.XXXXXX)
chmod 755 "$t"
cleanup() {
	pkill -f -- "serve --fuse $t/" || true
	sleep 0.2
	unmount_under "$t"
	rm -rf "$t"
}
trap cleanup EXIT
py() { python3 -c "import os, sys; $1" "${@:2}"; }

mkdir -p "$t/lower/d" "$t/upper" "$t/m"
echo data >"$t/lower/d/f"
echo tool >"$t/lower/d/tool"
echo gone >"$t/lower/d/gone"
chmod 666 "$t/lower/d/tool"
py "os.setxattr(sys.argv[1], 'user.origin', b'layer')" "$t/lower/d/f"
py "os.setxattr(sys.argv[1], 'user.origin', b'layer')" "$t/lower/d/gone"
py "os.setxattr(sys.argv[1], 'user.dir', b'd')" "$t/lower/d"
# cap_net_raw+ep as setcap writes it (VFS_CAP_REVISION_2).
cap='\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00'
py "os.setxattr(sys.argv[1], 'security.capability', b'$cap')" "$t/lower/d/tool"
for pass in "" --no-passthrough; do
	step "served ${pass:-with passthrough}"
	rm -rf "$t/upper" && mkdir "$t/upper"
	"$layerfs" serve --fuse "$t/m" --allow-other --layer "$t/lower" --upper "$t/upper" $pass >"$t/serve.log" 2>&1 &
	server=$!
	for _ in $(seq 100); do mounted "$t/m" && break; sleep 0.1; done
	mounted "$t/m" || fail "not mounted: $(cat "$t/serve.log")"
	m=$t/m/d
	[[ $(py "print(os.getxattr(sys.argv[1], 'user.origin').decode())" "$m/f") == layer ]] || fail "a lower file's attribute"
	[[ $(py "print(os.getxattr(sys.argv[1], 'user.dir').decode())" "$m") == d ]] || fail "a lower directory's attribute"
	py "os.setxattr(sys.argv[1], 'user.added', b'new')" "$m/f"
	[[ $(py "print(sorted(os.listxattr(sys.argv[1])))" "$m/f") == "['user.added', 'user.origin']" ]] || fail "list after a set"
	[[ $(py "print(sorted(os.listxattr(sys.argv[1])))" "$t/upper/d/f") == "['user.added', 'user.origin']" ]] || fail "the copy-up lost attributes"
	[[ $(py "print(sorted(os.listxattr(sys.argv[1])))" "$t/lower/d/f") == "['user.origin']" ]] || fail "the layer changed"
	py "os.removexattr(sys.argv[1], 'user.origin')" "$m/f"
	[[ $(py "print(os.listxattr(sys.argv[1]))" "$m/f") == "['user.added']" ]] || fail "remove"
	py "
try:
    os.getxattr(sys.argv[1], 'user.origin'); sys.exit(1)
except OSError as e:
    sys.exit(0 if e.errno == 61 else 2)" "$m/f" || fail "a removed attribute is not ENODATA"
	rm "$m/gone"
	echo again >"$m/gone"
	[[ $(py "print(os.listxattr(sys.argv[1]))" "$m/gone") == "[]" ]] || fail "a whiteout did not hide the old file's attributes"
	py "
try:
    os.setxattr(sys.argv[1], 'system.layerfs', b'x'); sys.exit(1)
except OSError as e:
    sys.exit(0 if e.errno in (95, 22) else 2)" "$m/f" || fail "a system. name was served"
	[[ $(py "print(os.getxattr(sys.argv[1], 'security.capability').hex())" "$m/tool") == 0100000200200000* ]] ||
		fail "the file capability does not show"
	setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "echo more >>$m/tool" || fail "the user could not write tool"
	py "
try:
    os.getxattr(sys.argv[1], 'security.capability'); sys.exit(1)
except OSError as e:
    sys.exit(0 if e.errno == 61 else 2)" "$m/tool" || fail "a user's write kept the file capability"
	py "os.getxattr(sys.argv[1], 'security.capability')" "$t/lower/d/tool" || fail "the layer lost its capability"
	if [[ $pass == --no-passthrough ]]; then
		pid=$(pgrep -f -- "serve --fuse $t/m")
		timeout 30 strace -f -c -e trace=lgetxattr,fgetxattr -p "$pid" -o "$t/strace" 2>/dev/null &
		tracer=$!
		sleep 1
		py "
f = open(sys.argv[1], 'ab')
for i in range(2000):
    f.write(b'x'); f.flush()" "$m/f"
		sleep 0.5
		pkill -INT -f "strace -f -c -e trace=lgetxattr,fgetxattr" || true
		wait $tracer || true
		# strace must have seen the writes' one lookup (by name, or through
		# the descriptor of the open file): no row, no check.
		calls=$(awk '$NF == "lgetxattr" || $NF == "fgetxattr" {n += $4; seen = 1} END {if (seen) print n}' "$t/strace")
		[[ -n $calls ]] || fail "strace saw no host lookup at all: $(cat "$t/strace")"
		[[ $calls == 1 ]] || fail "2,000 writes asked the host for attributes $calls times"
		echo "   2,000 writes through the door: $calls host lookup of security.capability"
	fi
	fusermount3 -u "$t/m"
	wait $server || true
done

# A door run by a user who is not root copies up a read-only file with its
# attributes: set before the copy's mode, which takes away the write
# permission a user needs to set one.
step "served by a user: a read-only file with an attribute, made writable; a file capability"
if ! setpriv --reuid=65534 --regid=65534 --clear-groups test -r /dev/fuse -a -w /dev/fuse; then
	skip_or_fail "FUSE extended attributes served by a user" "/dev/fuse is not open to users (chmod 666 /dev/fuse)"
	echo "FUSE extended attributes: ok"
	exit 0
fi
rm -rf "$t/upper" && mkdir "$t/upper"
echo locked >"$t/lower/d/locked"
py "os.setxattr(sys.argv[1], 'user.origin', b'layer')" "$t/lower/d/locked"
chmod 444 "$t/lower/d/locked"
chown -R 65534:65534 "$t/lower" "$t/upper" "$t/m"
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
as_nobody "$layerfs" serve --fuse "$t/m" --layer "$t/lower" --upper "$t/upper" >"$t/serve.log" 2>&1 &
for _ in $(seq 100); do mounted "$t/m" && break; sleep 0.1; done
mounted "$t/m" || fail "not mounted by the user: $(cat "$t/serve.log")"
as_nobody chmod 644 "$t/m/d/locked" || fail "the user could not make a read-only lower file writable"
[[ $(stat -c %a "$t/upper/d/locked") == 644 ]] || fail "the copy's mode: $(stat -c %a "$t/upper/d/locked")"
[[ $(py "print(os.getxattr(sys.argv[1], 'user.origin').decode())" "$t/upper/d/locked") == layer ]] ||
	fail "the copy-up lost the read-only file's attribute"
# A file capability, which only root may set: the user's copy-up goes
# without it (a user's import keeps none either), and the change is made.
py "os.setxattr(sys.argv[1], 'security.capability', b'$cap')" "$t/lower/d/tool"
as_nobody touch "$t/m/d/tool" || fail "the user could not touch a lower file with a file capability"
[[ -f $t/upper/d/tool && $(py "print(os.listxattr(sys.argv[1]))" "$t/upper/d/tool") == "[]" ]] ||
	fail "the user's copy of a file with a capability: $(ls -la "$t/upper/d")"
[[ $(py "print(os.getxattr(sys.argv[1], 'security.capability').hex())" "$t/lower/d/tool") == 0100000200200000* ]] ||
	fail "the layer lost its file capability"
fusermount3 -u "$t/m"
echo "FUSE extended attributes: ok"
