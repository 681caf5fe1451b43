#!/usr/bin/env bash
# What people do on a mounted workspace, through the Linux kernel NFSv3 client
# (in the guest of tools/kernel-client/run, which sets MNT, SERVER, NFS_PORT and
# NFS_OPTS) or through FUSE (tests/fuse/run.sh sets DOOR=fuse, MNT and SERVER,
# the command that mounts MNT in the foreground). Every step checks its result;
# the first failure ends the run.
set -euo pipefail
DOOR=${DOOR:-nfs}
cd "$MNT"
started=$(date +%s)
step() { printf '== [%3ss] %s\n' "$(($(date +%s) - started))" "$*"; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
sum_tree() { (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum | md5sum); }
expect_fail() { if "$@" 2>/dev/null; then echo "expected to fail: $*"; exit 1; fi; }

step "ls -la shows . and .."
ls -la | awk '{print $NF}' | grep -qx '\.'
ls -la | awk '{print $NF}' | grep -qx '\.\.'

step "a tree of 2,000 files and directories"
mkdir tree
for d in $(seq 1 40); do
	mkdir "tree/d$d"
	for f in $(seq 1 49); do echo "file $d/$f" >"tree/d$d/f$f"; done
done
[ "$(find tree | wc -l)" -eq 2001 ]
[ "$(cat tree/d17/f33)" = "file 17/33" ]

step "files of 0 B, 1 B, 4 KiB, 1 MiB and 64 MiB read back by checksum"
mkdir sizes
: >sizes/zero
printf x >sizes/one
head -c 4096 /dev/urandom >/tmp/4k; cp /tmp/4k sizes/4k
head -c 1048576 /dev/urandom >/tmp/1m; cp /tmp/1m sizes/1m
head -c 67108864 /dev/urandom >/tmp/64m; cp /tmp/64m sizes/64m
drop_caches
[ "$(stat -c %s sizes/zero)" -eq 0 ]
[ "$(cat sizes/one)" = x ]
for f in 4k 1m 64m; do cmp "/tmp/$f" "sizes/$f"; done

step "append, truncate, overwrite in the middle, sparse writes"
printf 'hello' >edit; printf ' world' >>edit
[ "$(cat edit)" = "hello world" ]
truncate -s 5 edit; [ "$(cat edit)" = hello ]
printf 'J' | dd of=edit bs=1 seek=1 conv=notrunc 2>/dev/null; [ "$(cat edit)" = hJllo ]
truncate -s 10000 edit; [ "$(stat -c %s edit)" -eq 10000 ]
[ "$(tail -c 9995 edit | tr -d '\0' | wc -c)" -eq 0 ]
dd if=/dev/urandom of=sparse bs=4096 count=1 seek=1000 2>/dev/null
drop_caches
[ "$(stat -c %s sparse)" -eq $((1001 * 4096)) ]
[ "$(head -c $((1000 * 4096)) sparse | tr -d '\0' | wc -c)" -eq 0 ]

step "a file removed while open: written, read and synced until closed"
# A temporary file made and unlinked at once. The NFS client renames it
# aside (.nfsXXXX) until the last close; FUSE and a local filesystem keep it
# without a name.
exec 3<>held
echo before >&3
rm held
[ ! -e held ]
echo after >&3
sync "/proc/$$/fd/3"
[ "$(cat /proc/$$/fd/3)" = "$(printf 'before\nafter')" ]
exec 3>&-
echo new >held; [ "$(cat held)" = new ]; rm held

step "renames of files and directories, over each other"
echo a >ra; echo b >rb
mv ra rb
[ "$(cat rb)" = a ]
[ ! -e ra ]
mkdir -p rd1/sub rd2; echo in >rd1/sub/file
mv rd1 rd2/moved; [ "$(cat rd2/moved/sub/file)" = in ]
mkdir empty_target
mv rd2/moved empty_target_new
mv empty_target_new/sub empty_target/
[ -f empty_target/sub/file ]
mkdir over; expect_fail mv -T over empty_target/sub
touch e1/marker 2>/dev/null || { mkdir e1 e2; touch e1/marker; }
mv -T e1 e2
[ -f e2/marker ]
[ ! -e e1 ]
# Each directory whose entries a rename changed, synced as a program does
# to make the rename durable (fsync of a directory's descriptor).
sync . rd2 empty_target e2

step "hard links, symlinks, mkfifo"
echo linked >orig; ln orig hard
[ "$(stat -c %h orig)" -eq 2 ]
[ "$(stat -c %i orig)" = "$(stat -c %i hard)" ]
echo more >>hard; [ "$(cat orig)" = "$(printf 'linked\nmore')" ]
ln -s orig soft
[ "$(readlink soft)" = orig ]
[ "$(cat soft)" = "$(cat orig)" ]
ln -s /nonexistent/target dangling; [ "$(readlink dangling)" = /nonexistent/target ]
mkfifo pipe; [ -p pipe ]

step "chmod, chown, touch -d"
chmod 640 orig; [ "$(stat -c %a orig)" = 640 ]
chmod 4755 orig; [ "$(stat -c %a orig)" = 4755 ]; chmod 644 orig
chown 1234:5678 orig; [ "$(stat -c %u:%g orig)" = 1234:5678 ]
touch -d '2001-02-03 04:05:06 UTC' orig
[ "$(stat -c %Y orig)" -eq "$(date -d '2001-02-03 04:05:06 UTC' +%s)" ]

step "ls -la, find, du"
ls -la tree >/dev/null
[ "$(find tree -type f | wc -l)" -eq 1960 ]
[ "$(find tree -type d | wc -l)" -eq 41 ]
du -s sizes | awk '{exit !($1 >= 65536)}'

step "tar extract and compare"
tar -cf /tmp/tree.tar -C "$MNT" tree/d1 tree/d2 tree/d3 tree/d4 tree/d5 tree/d6 tree/d7 tree/d8
mkdir untar; tar -C untar -xf /tmp/tree.tar
tar -C untar -df /tmp/tree.tar

step "error cases"
expect_fail mkdir tree
expect_fail rmdir tree
expect_fail rm sizes
expect_fail cat no-such-file
expect_fail ln tree tree-hardlink

if [ "$DOOR" = nfs ]; then
step "checksum after a remount"
before=$(sum_tree "$MNT")
cd /
umount "$MNT"
busybox mount -t nfs -o "$NFS_OPTS" 127.0.0.1:/ "$MNT"
cd "$MNT"
[ "$(sum_tree "$MNT")" = "$before" ]

step "checksum after a server restart with the mount kept"
exec 3<"$MNT/sizes/1m" # a file held open across the restart
old=$(pgrep -f 'layerfs serve')
[ -n "$old" ]
kill $old
for _ in $(seq 100); do kill -0 $old 2>/dev/null || break; sleep 0.1; done
expect_fail kill -0 $old
(eval "$SERVER" >>"${SERVER_LOG:-/dev/null}" 2>&1 3<&- &) # the server must not hold the file open
listening() { awk -v p="$(printf ':%04X' "$NFS_PORT")" '$2 ~ p"$" && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp; }
for _ in $(seq 100); do listening && break; sleep 0.1; done
listening
new=$(pgrep -f 'layerfs serve')
[ -n "$new" ]
[ "$new" != "$old" ]
drop_caches
[ "$(sum_tree "$MNT")" = "$before" ]
cmp <(cat <&3) /tmp/1m
echo "after restart" >>orig
[ "$(tail -n 1 orig)" = "after restart" ]

exec 3<&- # closed, or the client keeps it as a .nfs file ("silly rename")
else
step "checksum after the door is unmounted and mounted again"
before=$(sum_tree "$MNT")
cd /
door_pid() { pgrep -f -- "serve --fuse $MNT" || true; }
mounted() { awk -v m="$MNT" '$2 == m {f=1} END {exit !f}' /proc/mounts; }
old=$(door_pid)
[ -n "$old" ]
umount "$MNT" # the door sees its mount go and exits
for _ in $(seq 100); do kill -0 $old 2>/dev/null || break; sleep 0.1; done
expect_fail kill -0 $old
start_door() {
	(eval "$SERVER" >/dev/null 2>&1 &)
	for _ in $(seq 100); do mounted && break; sleep 0.1; done
	mounted
}
start_door
cd "$MNT"
[ "$(sum_tree "$MNT")" = "$before" ]

step "checksum after the door is stopped (SIGTERM unmounts) and started again"
old=$(door_pid)
cd /
kill $old
for _ in $(seq 100); do kill -0 $old 2>/dev/null || break; sleep 0.1; done
expect_fail kill -0 $old
expect_fail mounted
start_door
new=$(door_pid)
[ -n "$new" ]
[ "$new" != "$old" ]
cd "$MNT"
drop_caches
[ "$(sum_tree "$MNT")" = "$before" ]
echo "after restart" >>orig
[ "$(tail -n 1 orig)" = "after restart" ]
fi

step "rm -rf"
rm -rf tree untar sizes
[ ! -e tree ]
[ ! -e sizes ]
rm -rf "$MNT"/*
[ -z "$(ls -A "$MNT")" ]

if [ "$DOOR" = nfs ]; then
	grep -E '^\s+(GETATTR|LOOKUP|READ|WRITE|CREATE|READDIRPLUS|COMMIT):' /proc/self/mountstats | awk '{print $1, $2}' | tr '\n' ' '
	echo
fi
echo "workload passed"
