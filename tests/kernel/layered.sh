#!/usr/bin/env bash
# A three-layer workspace (tests/kernel/stack.sh) through the Linux kernel
# NFSv3 client or FUSE (WS names the workspace directory where it is not
# one of the places searched below): what the layers show, changes to lower files (also while
# other processes hold them open), then the whole of workload.sh on top.
set -euo pipefail
# The guest runs a copy of this file; the repository is the working directory.
source "$PWD/tests/lib.sh"
repo=$PWD
cd "$MNT"
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
expect_fail() { if "$@" 2>/dev/null; then echo "expected to fail: $*"; exit 1; fi; }
ws=${WS:-}
[ -n "$ws" ] || for dir in /run/ws /run/on-*/ws /tmp/on-*/ws; do
	if [ -d "$dir" ]; then ws=$dir; fi
done
[ -d "$ws" ]

step "the layers merged: replaced, whited out, opaque, added"
[ "$(cat base/keep)" = middle ]
[ ! -e base/gone ]
[ "$(ls base/dir | tr '\n' ' ')" = "a c d " ]
[ "$(ls -A base/opq)" = shown ]
[ "$(cat top-only)" = top ]
[ "$(readlink base/keep-link)" = keep ]
[ -z "$(find . -name '.wh.*')" ]

step "a write to a lower file keeps its inode number"
ino=$(stat -c %i base/keep)
echo more >>base/keep
[ "$(stat -c %i base/keep)" = "$ino" ]
drop_caches
[ "$(cat base/keep)" = "$(printf 'middle\nmore')" ]

step "lower files changed while other processes hold them open: no ESTALE"
exec 3<base/held   # held for reading by this shell
exec 4>>base/held2 # held for appending
sleep 1000 <base/big &
holder=$!
echo changed >base/held # another process rewrites it: copy-up
[ "$(cat <&3)" = changed ]
printf 'appended\n' >&4 # the first write through a descriptor opened below
exec 4>&-
[ "$(tail -n 1 base/held2)" = appended ]
sum=$(md5sum <base/big)
printf 'tail' >>base/big
drop_caches
[ "$(head -c 4194304 base/big | md5sum)" = "$sum" ]
[ "$(tail -c 4 base/big)" = tail ]
kill $holder
exec 3<&-

step "lower hard links stay one file"
[ "$(stat -c %i base/links/one)" = "$(stat -c %i base/links/two)" ]
echo again >>base/links/one
[ "$(tail -n 1 base/links/two)" = again ]
[ "$(stat -c %h base/links/two)" = 2 ]

step "removing and renaming lower entries"
rm base/keep
[ ! -e base/keep ]
[ -f $ws/l2/base/keep ]
sum=$(cd lowerdir && cat f* sub/deep | md5sum)
ino=$(stat -c %i lowerdir/sub/deep)
mv lowerdir renamed
[ ! -e lowerdir ]
[ "$(ls renamed | wc -l)" = 101 ]
[ "$(cd renamed && cat f* sub/deep | md5sum)" = "$sum" ]
[ "$(stat -c %i renamed/sub/deep)" = "$ino" ]
expect_fail rmdir base/dir
rm -rf base/dir
[ ! -e base/dir ]
mkdir base/dir
[ -z "$(ls -A base/dir)" ]
# fsync of directories: changed ones, and one only a layer holds.
sync . base base/dir renamed renamed/sub

step "the layers themselves never changed"
(cd $ws && md5sum --quiet -c sums)

step "the whole workload on top of the layers"
exec bash "$repo/tests/kernel/workload.sh"
