#!/usr/bin/env bash
# The workspace daemon's end, and what outlives it, through FUSE: kill -9
# the daemon under a reader, a writer and ls and start it again (the mount
# stays, and none of them sees an error); an upgrade (`daemon --upgrade`)
# hands the mounts over; across both, files held open (read, write,
# append, a shared mapping, one whose name was removed) are used, opened
# again while held, and opened, written and copied up once closed
# (tests/daemon/held.py), the removed one let go of after its release;
# unmount by path, a mount over a dead FUSE mount; SIGTERM leaves no mount
# and no keeper.
# With OLD, the daemon that makes the workspaces and is killed is that
# binary (an earlier build): the restart then takes over mounts an earlier
# daemon made and its keeper kept.
# Needs root and /dev/fuse; says SKIPPED without them (tests/skip.sh).
# usage: tests/daemon/takeover.sh LAYERFS [OLD]
set -euo pipefail
layerfs=$(realpath "$1")
new=$layerfs
[[ -n ${2:-} ]] && layerfs=$(realpath "$2")
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../fusectl.sh"
source "$(dirname "$0")/lib.sh"
daemon_scratch "the daemon's takeovers through FUSE"

# Two workspaces: w over both layers with a file of its own, and w2 from
# w's commit, whose files are all lower files (never passed through).
start_daemon
base_layers
mkdir -p "$t/w" "$t/w2"
"$layerfs" create w --from "$base" --from "$top" >/dev/null
"$layerfs" mount w "$t/w" --fuse >/dev/null
echo new >"$t/w/new"
"$layerfs" commit w --message "w's file" >/dev/null
"$layerfs" create w2 --from w >/dev/null
"$layerfs" mount w2 "$t/w2" >/dev/null
check "$t/w2/new" new

step "kill -9 of the daemon under a reader, a writer and ls: the mount stays, all three carry on"
dd if=/dev/urandom of="$t/w/synced" bs=64k count=16 conv=fsync status=none
want=$(sha256sum <"$t/w/synced")
# The keeper holds the mount's session while no daemon serves it: requests
# wait in the kernel, and the next daemon answers them (and those the dead
# one had read and not answered, sent again). Nothing may fail.
dd if=/dev/urandom of="$t/blocks" bs=64k count=512 status=none
rm -f "$t/synced-blocks" "$t/stop" "$t/ls-failed"
(
	for i in $(seq 0 511); do
		dd if="$t/blocks" of="$t/w/inflight" bs=64k skip=$i seek=$i count=1 conv=notrunc,fsync \
			status=none || exit 1
		echo "$i" >>"$t/synced-blocks"
	done
) &
writer=$!
# A descriptor held on a lower file (w2's, from w's commit: never passed
# through), read again and again through the door: each read dropped from
# the page cache first, so that each is a READ the daemon answers.
python3 -c '
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
first = os.pread(fd, 64, 0)
end = time.monotonic() + 8
while time.monotonic() < end:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    if os.pread(fd, 64, 0) != first:
        sys.exit("the lower file read wrong")
' "$t/w2/new" &
reader=$!
(while [[ ! -e $t/stop ]]; do ls "$t/w" >/dev/null || echo failed >>"$t/ls-failed"; done) &
lister=$!
for _ in $(seq 300); do [[ $(wc -l 2>/dev/null <"$t/synced-blocks" || echo 0) -ge 8 ]] && break; sleep 0.05; done
kill -0 "$writer" 2>/dev/null || fail "the writer was not running at the kill"
kill -0 "$reader" 2>/dev/null || fail "the reader was not running at the kill"
hold "$t/w2" etc/name
kill -9 "$daemon"
wait "$daemon" 2>/dev/null || true
daemon=
sleep 1
mounted "$t/w" || fail "w's mount went with the daemon"
# The reader's READ waits in the kernel for the next daemon: it reaches
# the door (its connection's count of requests waiting).
waiting=$(fuse_waiting "$t/w2")
[[ $waiting =~ ^[1-9] ]] ||
	fail "no request of w2's waits while no daemon serves it (waiting: $waiting): the reader does not reach the door"
layerfs=$new
start_daemon
held_go "a kill -9 and restart"
wait "$writer" || fail "the writer got an error across the kill and restart"
wait "$reader" || fail "the reader got an error across the kill and restart"
touch "$t/stop"
wait "$lister"
lister=
[[ -e $t/ls-failed ]] && fail "ls failed $(wc -l <"$t/ls-failed") times across the kill and restart"
grep -q "FUSE session taken over" "$t/daemon.log" || fail "the restarted daemon mounted w afresh"
[[ $(sha256sum <"$t/w/synced") == "$want" ]] || fail "synced data changed across the crash"
cmp "$t/w/inflight" "$t/blocks" || fail "the file written across the kill differs from what was written"
echo "   512 blocks written, a lower file read and ls run across a kill -9 and restart: no error, all whole"

step "daemon --upgrade: the running daemon hands its mounts over, nothing is unmounted"
old=$daemon
rm -f "$t/stop" "$t/ls-failed"
(while [[ ! -e $t/stop ]]; do ls "$t/w" >/dev/null || echo failed >>"$t/ls-failed"; done) &
lister=$!
taken=$(grep -c "FUSE session taken over" "$t/daemon.log")
hold "$t/w2" new
coproc DAEMON { exec "$layerfs" daemon --upgrade 2>>"$t/daemon.log"; } 2>/dev/null
daemon=$DAEMON_PID
read -r -t 60 ready <&"${DAEMON[0]}" || fail "the upgrading daemon never said it was ready"
[[ $ready == "layerfs daemon ready"* ]] || fail "first line after the upgrade: $ready"
rc=0
wait "$old" || rc=$?
[[ $rc == 0 ]] || fail "the daemon handing over exited with $rc"
held_go "daemon --upgrade"
touch "$t/stop"
wait "$lister"
lister=
[[ -e $t/ls-failed ]] && fail "ls failed across the hand-over"
[[ $(grep -c "FUSE session taken over" "$t/daemon.log") == $((taken + 2)) ]] ||
	fail "the new daemon did not take over both FUSE mounts"
check "$t/w/new" new
check "$t/w2/new" $'new\nappended'  # held.py appended to it
[[ $(state_of w2) == mounted ]] || fail "ls after restart: $("$layerfs" ls)"

step "unmount by path; SIGTERM unmounts the rest and exits 0"
"$layerfs" unmount "$t/w2"
mounted "$t/w2" && fail "w2 still mounted"
mkdir "$t/dead"
"$layerfs" serve --fuse "$t/dead" "$t/base" >/dev/null 2>&1 &
for _ in $(seq 100); do mounted "$t/dead" && break; sleep 0.1; done
kill -9 $!
wait $! 2>/dev/null || true
"$layerfs" mount w2 "$t/dead" >/dev/null || fail "mount over a dead FUSE mount"
check "$t/dead/new" $'new\nappended'
"$layerfs" unmount w2
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=
[[ $rc == 0 ]] || fail "exit status $rc after SIGTERM"
for _ in $(seq 50); do pgrep -f "layerfs keeper --store $t/store" >/dev/null || break; sleep 0.1; done
pgrep -f "layerfs keeper --store $t/store" >/dev/null && fail "a keeper is left holding nothing after SIGTERM"
mounted "$t/w" && fail "w still mounted after SIGTERM"
out=$("$layerfs" ls 2>&1) && fail "ls without a daemon succeeded"
grep -q "no layerfs daemon is running" <<<"$out" || fail "ls without a daemon: $out"
start_daemon
[[ $(state_of w) == unmounted ]] || fail "after SIGTERM w is recorded unmounted: $("$layerfs" ls)"
kill -TERM "$daemon"
wait "$daemon" || fail "the daemon's exit status after SIGTERM"
daemon=
echo "PASSED: the daemon's takeovers through FUSE"
