#!/usr/bin/env bash
# POSIX rules for callers who are not root, through the Linux kernel NFSv3
# client (in the guest of tools/kernel-client/run) or through FUSE
# (tests/fuse/run.sh, DOOR=fuse): each step runs as uid 65533 or 65534
# (setpriv) on the mount MNT and on a tmpfs of the machine's own; the local
# transcript must be the one Linux is known to give, and the mount's the same.
set -euo pipefail
DOOR=${DOOR:-nfs}
as() {
	local uid=$1
	shift
	setpriv --reuid="$uid" --regid="$uid" --clear-groups "$@"
}
# ok, refused, or (a cause both sides would share, which must not pass as a
# refusal) a missing command.
try() {
	local rc=0
	"$@" 2>/dev/null || rc=$?
	case $rc in
	0) echo ok ;;
	126 | 127) echo "missing: $*" ;;
	*) echo refused ;;
	esac
}

# The owner of $1 opens it for appending; root makes it setuid and setgid
# meanwhile; then the owner writes through the descriptor it holds.
write_while_made_setuid() {
	local sync pid
	sync=$(mktemp -d)
	chmod 755 "$sync"
	mkfifo -m 666 "$sync/opened" "$sync/go"
	as 65533 sh -c 'exec 3>>"$1" && echo >"$2" && read -r _ <"$3" && echo x >&3' sh "$1" "$sync/opened" "$sync/go" &
	pid=$!
	read -r _ <"$sync/opened"
	chmod 6777 "$1"
	echo >"$sync/go"
	wait "$pid"
	rm -rf "$sync"
}

rules() {
	cd "$1"
	mkdir w
	chmod 777 w
	cd w
	touch f
	chown 65533:65533 f
	echo "chown to the same owner, by another user: $(try as 65534 chown 65533 f)"
	echo "chgrp to the same group, by another user: $(try as 65534 chgrp 65533 f)"
	echo "chown to the same owner, by the owner: $(try as 65533 chown 65533 f)"
	chmod 6777 f
	as 65534 sh -c 'echo x >>f'
	echo "mode after a write by another user: $(stat -c %a f)"
	chmod 6777 f
	as 65533 sh -c 'echo x >>f'
	echo "mode after a write by the owner: $(stat -c %a f)"
	chmod 6777 f
	echo x >>f
	echo "mode after a write by root: $(stat -c %a f)"
	as 65533 truncate -s 1 f
	echo "mode after a truncate by the owner: $(stat -c %a f)"
	chmod 777 f
	write_while_made_setuid f
	echo "mode after a write through a descriptor opened before chmod 6777: $(stat -c %a f)"
	touch g
	chown 65533:100 g
	as 65533 chmod 2755 g
	echo "chmod 2755 by an owner outside the group: $(stat -c %a g)"
	long=$(printf 'n%.0s' $(seq 255))
	as 65533 sh -c "umask 0157 && touch $long && umask 0024 && touch short"
	echo "new file modes (0620, 0642 asked): $(stat -c %a "$long" short | tr '\n' ' ')"
	mkdir -p p/dir p/other
	chown -R 65533:65533 p
	chmod 777 p p/other
	chmod 555 p/dir
	echo "move a 0555 directory to another parent, by another user: $(try as 65534 mv p/dir p/other/)"
	echo "rename it within its parent, by another user: $(try as 65534 mv p/dir p/dir2)"
	echo "remove a missing name without write permission: $(try as 65534 rm p/dir2/missing)"
	mkdir s
	chmod 1777 s
	as 65533 touch s/theirs
	echo "rename in a sticky directory, by another user: $(try as 65534 mv s/theirs s/mine)"
	echo "remove in a sticky directory, by another user: $(try as 65534 rm -f s/theirs)"
	echo "sticky directory holds: $(ls s | tr '\n' ' ')"
	echo "rename in a sticky directory, by the owner: $(try as 65533 mv s/theirs s/mine)"
	echo "sticky directory holds: $(ls s | tr '\n' ' ')"
	# A name reached before is not reached again once search permission
	# on its directory is gone, however long it was cached.
	mkdir -p q/d
	echo data >q/d/f
	chown -R 65533:65533 q
	as 65533 cat q/d/f >/dev/null
	chmod 644 q/d
	echo "read a file under a directory without search permission: $(try as 65533 cat q/d/f)"
	echo "chmod it: $(try as 65533 chmod 600 q/d/f)"
	echo "truncate it: $(try as 65533 truncate -s 0 q/d/f)"
	chmod 755 q/d
	echo "read it once search permission is back: $(try as 65533 cat q/d/f)"
	# An owner without write permission truncates nothing.
	echo data >t
	chown 65533:65533 t
	chmod 444 t
	echo "open with O_TRUNC by an owner without write permission: $(try as 65533 sh -c ': >t')"
	echo "truncate by that owner: $(try as 65533 truncate -s 1 t)"
	echo "truncate(2) by that owner: $(try as 65533 perl -e 'truncate("t", 1) or exit 1')"
	echo "O_RDONLY|O_TRUNC by that owner: $(try as 65533 perl -MFcntl -e 'sysopen(my $f, "t", O_RDONLY | O_TRUNC) or exit 1')"
	echo "size after: $(stat -c %s t)"
	# A FIFO's mode holds too (the kernel opens it, not the server).
	mkfifo fifo
	chown 65533:65533 fifo
	chmod 444 fifo
	echo "open a 0444 FIFO for reading and writing, by its owner: $(try as 65533 sh -c 'exec 3<>fifo')"
	chmod 666 fifo
	echo "and once it is 0666: $(try as 65533 sh -c 'exec 3<>fifo')"
}

# What Linux does on its own tmpfs: the reference side must show it, or a
# cause both sides share (a missing tool, a setpriv that cannot switch)
# would pass as agreement.
expected() {
	cat <<'EXPECTED'
chown to the same owner, by another user: refused
chgrp to the same group, by another user: refused
chown to the same owner, by the owner: ok
mode after a write by another user: 777
mode after a write by the owner: 777
mode after a write by root: 6777
mode after a truncate by the owner: 777
mode after a write through a descriptor opened before chmod 6777: 777
chmod 2755 by an owner outside the group: 755
new file modes (0620, 0642 asked): 620 642 
move a 0555 directory to another parent, by another user: refused
rename it within its parent, by another user: ok
remove a missing name without write permission: refused
rename in a sticky directory, by another user: refused
remove in a sticky directory, by another user: refused
sticky directory holds: theirs 
rename in a sticky directory, by the owner: ok
sticky directory holds: mine 
read a file under a directory without search permission: refused
chmod it: refused
truncate it: refused
read it once search permission is back: data
ok
open with O_TRUNC by an owner without write permission: refused
truncate by that owner: refused
truncate(2) by that owner: refused
O_RDONLY|O_TRUNC by that owner: refused
size after: 5
open a 0444 FIFO for reading and writing, by its owner: refused
and once it is 0666: ok
EXPECTED
}

work=$(mktemp -d /run/permissions.XXXXXX)
mkdir "$work/reference"
mount -t tmpfs reference "$work/reference"
trap 'umount "$work/reference"; rm -rf "$work"' EXIT
(rules "$work/reference") >"$work/local.txt"
(rules "$MNT") >"$work/$DOOR.txt"
if ! diff -u <(expected) "$work/local.txt"; then
	echo "the local tmpfs does not behave as Linux is known to (- expected, + local): is a tool missing?"
	exit 1
fi
cat "$work/$DOOR.txt"
if ! diff -u "$work/local.txt" "$work/$DOOR.txt"; then
	echo "the $DOOR mount does not behave as the local tmpfs (- local, + $DOOR)"
	exit 1
fi
echo "permissions passed"
