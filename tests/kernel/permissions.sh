#!/usr/bin/env bash
# POSIX rules for callers who are not root, through the Linux kernel NFSv3
# client: each step runs as uid 65533 or 65534 (setpriv) on the mount and on
# the guest's own tmpfs, and the two transcripts must be the same.
set -euo pipefail
as() {
	local uid=$1
	shift
	setpriv --reuid="$uid" --regid="$uid" --clear-groups "$@"
}
try() { if "$@" 2>/dev/null; then echo ok; else echo refused; fi; }

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
}

mkdir -p /run/reference
mount -t tmpfs reference /run/reference
(rules /run/reference) >/run/local.txt
(rules "$MNT") >/run/nfs.txt
cat /run/nfs.txt
if ! diff -u /run/local.txt /run/nfs.txt; then
	echo "the NFS mount does not behave as the local tmpfs (- local, + NFS)"
	exit 1
fi
echo "permissions passed"
