#!/usr/bin/env bash
# The FUSE door's start and stop as a user meets them: one-line errors,
# SIGTERM unmounts and exits 0, a door killed with -9 leaves a mount that
# fails fast and that a restart or fusermount3 -u clears, a door unmounted
# from outside exits and leaves a later mount at its path, passthrough keeps
# reads away from the door (and --no-passthrough does not), a file made
# setuid behind the door loses the bit at a write through passthrough, and
# a user who is not root mounts through fusermount3 a mount no other user can reach.
# Needs root and /dev/fuse; says SKIPPED without them (tests/skip.sh).
# usage: tests/fuse/door.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
source "$(dirname "$0")/../lib.sh"
if [[ ! -c /dev/fuse || $(id -u) != 0 ]]; then
	skip_or_fail "FUSE door checks" "need root and /dev/fuse"
	exit 0
fi
t=$(mktemp -d /tmp/layerfs-door.XXXXXX)
chmod 755 "$t"
cleanup() {
	pkill -f -- "serve --fuse $t/" || true
	sleep 0.2
	unmount_under "$t"
	rm -rf "$t"
}
trap cleanup EXIT
wait_mounted() { for _ in $(seq 100); do mounted "$1" && return; sleep 0.1; done; fail "$1 never mounted"; }
# Runs the door, expecting it to fail with a message containing $1.
refused() {
	local want=$1
	shift
	local out
	if out=$("$@" 2>&1); then fail "expected to fail: $*"; fi
	out=$(grep -v ' INFO ' <<<"$out")
	[[ $(wc -l <<<"$out") == 1 ]] || fail "more than one line: $out"
	grep -qF -- "$want" <<<"$out" || fail "'$want' not in: $out"
	echo "   refused: $out"
}
mkdir "$t/src" "$t/mnt" "$t/full"
echo data >"$t/src/file"
touch "$t/full/x"

step "clear errors"
refused "mount point $t/none" "$layerfs" serve --fuse "$t/none" "$t/src"
refused "is not empty" "$layerfs" serve --fuse "$t/full" "$t/src"
refused "cannot export $t/nodir" "$layerfs" serve --fuse "$t/mnt" "$t/nodir"
refused "/dev/fuse is missing" unshare -m sh -c \
	"mount -t tmpfs none /dev && exec $layerfs serve --fuse $t/mnt $t/src"
refused "fusermount3 is missing" env PATH=/nonexistent "$(command -v setpriv)" \
	--reuid 65534 --regid 65534 --clear-groups "$layerfs" serve --fuse "$t/mnt" "$t/src"
if command -v fusermount3 >/dev/null; then
	# fusermount3 opens the device as the user: where it is 0600 only root mounts.
	refused "/dev/fuse is not open to this user" unshare -m sh -c \
		"mount -t tmpfs none /dev && mknod -m 600 /dev/fuse c 10 229 &&
		exec setpriv --reuid 65534 --regid 65534 --clear-groups $layerfs serve --fuse $t/mnt $t/src"
else
	skip_or_fail "FUSE door: the message for a closed /dev/fuse" "fusermount3 is not installed (apt-get install fuse3)"
fi

step "SIGTERM unmounts and exits 0"
"$layerfs" serve --fuse "$t/mnt" "$t/src" >/dev/null 2>&1 &
door=$!
wait_mounted "$t/mnt"
[[ $(cat "$t/mnt/file") == data ]] || fail "read through the mount"
kill -TERM $door
rc=0
wait $door || rc=$?
[[ $rc == 0 ]] || fail "exit status $rc after SIGTERM"
mounted "$t/mnt" && fail "still mounted after SIGTERM"

step "unmounted from outside: the door exits and leaves alone what is mounted there since"
# The door's banner says fusermount3 -u stops it; a door that unmounted its
# path again on the way out would take whatever was mounted there since (a
# restarted door's mount: here a bind mount, made at once).
mkdir -p "$t/since"
echo since >"$t/since/mark"
"$layerfs" serve --fuse "$t/mnt" "$t/src" >/dev/null 2>&1 &
door=$!
wait_mounted "$t/mnt"
umount "$t/mnt"
mount --bind "$t/since" "$t/mnt"
rc=0
timeout 10 tail --pid=$door -f /dev/null || rc=$?
[[ $rc == 0 ]] || fail "the door did not exit once unmounted from outside"
wait $door || fail "exit status $? once unmounted from outside"
[[ $(cat "$t/mnt/mark" 2>/dev/null) == since ]] || fail "the door unmounted what was mounted at its path after it"
umount "$t/mnt"

step "kill -9: the mount fails fast, a restart clears it"
("$layerfs" serve --fuse "$t/mnt" "$t/src" >/dev/null 2>&1 &)
wait_mounted "$t/mnt"
pkill -9 -f -- "serve --fuse $t/mnt"
sleep 0.2
rc=0
timeout 5 ls "$t/mnt" >/dev/null 2>&1 || rc=$?
[[ $rc != 124 ]] || fail "ls of a dead mount hung"
[[ $rc != 0 ]] || fail "a dead mount still lists"
("$layerfs" serve --fuse "$t/mnt" "$t/src" >/dev/null 2>&1 &)
for _ in $(seq 100); do [[ -e $t/mnt/file ]] && break; sleep 0.1; done
[[ $(cat "$t/mnt/file") == data ]] || fail "the restarted door does not serve"
[[ $(awk -v m="$t/mnt" '$2 == m' /proc/mounts | wc -l) == 1 ]] || fail "mounts stacked up"

step "kill -9: fusermount3 -u clears it"
pkill -9 -f -- "serve --fuse $t/mnt"
sleep 0.2
if command -v fusermount3 >/dev/null; then
	fusermount3 -u "$t/mnt"
else
	umount "$t/mnt"
fi
mounted "$t/mnt" && fail "still mounted"
[[ -z $(ls -A "$t/mnt") ]] || fail "the mount point is not empty again"

step "passthrough: as root, reads never reach the door; without passthrough, they do, 1 MiB at a time"
# The requests the door answered (it says how many at its unmount) while a
# reader reads a 64 MiB file through a fresh mount: with passthrough the
# kernel reads the host file itself; without it, the root door widens the
# mount's readahead so that each READ carries about 1 MiB, and splices it.
head -c $((64 << 20)) /dev/urandom >"$t/src/big"
door_requests() { # door_requests LOG [FLAGS]: requests the door answered while the file was read
	local log=$1
	shift
	RUST_LOG=info "$layerfs" serve --fuse "$t/mnt" "$@" "$t/src" >/dev/null 2>"$log" &
	local door=$!
	wait_mounted "$t/mnt"
	cat "$t/mnt/big" >/dev/null
	cmp "$t/mnt/big" "$t/src/big" || fail "the file read through the mount differs"
	kill -TERM $door
	wait $door || fail "the door's exit status after SIGTERM"
	sed -n 's/.* unmounted: \([0-9]*\) requests were answered through \/dev\/fuse.*/\1/p' "$log"
}
with=$(door_requests "$t/with.log")
without=$(door_requests "$t/without.log" --no-passthrough)
echo "   the door answered ${with:-no} requests with passthrough, ${without:-no} without"
[[ -n $with && -n $without ]] || fail "the door did not say how many requests it answered"
# A READ carries 1 MiB at most: 64 of them at the least; at the kernel's
# default 128 KiB, 512.
[[ $without -ge 64 ]] || fail "without passthrough the door answered only $without requests"
[[ $without -le 300 ]] || fail "the door answered $without requests for 64 MiB: READs are not 1 MiB"
if grep -q "passthrough=false" "$t/with.log"; then
	skip_or_fail "FUSE door: passthrough" "this kernel ($(uname -r)) did not grant passthrough (6.9 or later offers it)"
else
	grep -q "passthrough=true" "$t/with.log" || fail "the door did not say whether it has passthrough"
	[[ $with -lt 32 ]] || fail "with passthrough the door still answered $with requests"
fi
rm "$t/src/big"

step "a file made setuid behind the door loses it at a write through passthrough"
# A plain directory is changed by others: the kernel does not know the bit
# was set, so nobody asks the door; the host clears it, as the backing file
# was registered without CAP_FSETID.
RUST_LOG=info "$layerfs" serve --allow-other --fuse "$t/mnt" "$t/src" >/dev/null 2>"$t/suid.log" &
door=$!
wait_mounted "$t/mnt"
chmod 777 "$t/src"
touch "$t/mnt/suid"
chown 65533:65533 "$t/mnt/suid"
chmod 777 "$t/mnt/suid"
mkfifo -m 666 "$t/opened" "$t/go"
setpriv --reuid 65533 --regid 65533 --clear-groups sh -c \
	'exec 3>>"$1" && echo a >&3 && echo >"$2" && read -r _ <"$3" && echo b >&3' sh "$t/mnt/suid" "$t/opened" "$t/go" &
writer=$!
read -r _ <"$t/opened"
chmod 6777 "$t/src/suid"
echo >"$t/go"
wait $writer || fail "the writer failed"
kill -TERM $door
wait $door || fail "the door's exit status after SIGTERM"
if grep -q "passthrough=true" "$t/suid.log"; then
	[[ $(stat -c %a "$t/src/suid") == 777 ]] || fail "a write through passthrough kept mode $(stat -c %a "$t/src/suid")"
	echo "   mode after the write: $(stat -c %a "$t/src/suid")"
else
	skip_or_fail "FUSE door: setuid behind the door" "this kernel ($(uname -r)) did not grant passthrough (6.9 or later offers it)"
fi
[[ $(cat "$t/src/suid") == $'a\nb' ]] || fail "the writes did not both land"
rm "$t/src/suid" "$t/opened" "$t/go"
chmod 755 "$t/src"

step "a user who is not root mounts; other users cannot reach the mount"
if ! command -v fusermount3 >/dev/null; then
	skip_or_fail "FUSE door: a user who is not root" "fusermount3 is not installed (apt-get install fuse3)"
elif ! setpriv --reuid 1000 --regid 1000 --clear-groups test -r /dev/fuse -a -w /dev/fuse; then
	skip_or_fail "FUSE door: a user who is not root" "/dev/fuse is not open to users who are not root here (Debian makes it 0666; verify.sh opens it for its run)"
else
	as() { local u=$1; shift; setpriv --reuid "$u" --regid "$u" --clear-groups "$@"; }
	mkdir "$t/own" "$t/own/src" "$t/own/mnt"
	echo mine >"$t/own/src/file"
	chown -R 1000:1000 "$t/own"
	setpriv --reuid 1000 --regid 1000 --clear-groups \
		"$layerfs" serve --fuse "$t/own/mnt" "$t/own/src" >/dev/null 2>"$t/user.log" &
	door=$!
	wait_mounted "$t/own/mnt"
	[[ $(as 1000 cat "$t/own/mnt/file") == mine ]] || fail "the owner cannot read"
	as 1000 sh -c "echo new >$t/own/mnt/new" || fail "the owner cannot write"
	[[ $(stat -c %u "$t/own/src/new") == 1000 ]] || fail "the new file is not the owner's"
	if as 1001 ls "$t/own/mnt" 2>/dev/null; then fail "another user listed the mount"; fi
	if as 1001 cat "$t/own/mnt/file" 2>/dev/null; then fail "another user read the mount"; fi
	kill -TERM $door
	rc=0
	wait $door || rc=$?
	[[ $rc == 0 ]] || { cat "$t/user.log"; fail "exit status $rc after SIGTERM"; }
	mounted "$t/own/mnt" && fail "still mounted after SIGTERM"
fi
echo "door checks passed"
