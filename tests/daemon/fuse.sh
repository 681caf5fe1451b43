#!/usr/bin/env bash
# The workspace daemon end to end through FUSE on this machine: import a
# directory and an OCI tarball (its devices and FIFOs kept, the device
# out of reach on the nodev mount), make a workspace on both, mount it, change
# files, diff, reset while mounted, a size limit, a long import and a
# long commit of another workspace beside
# other requests, commit (also while programs write: one moment), make a
# second workspace from the commit and see the changes there; twenty more
# mounts within their memory and threads. The daemon's kills, upgrade and
# SIGTERM are tests/daemon/takeover.sh; the demo and a user's daemon,
# tests/daemon/user.sh.
# With io-uring, the daemon runs with --io-uring and the fuse module's
# enable_uring set (put back after): every step goes through its rings,
# whose log must show requests given to them; then a kill -9 with the
# mounts idle, requests made while no daemon runs, and the next daemon
# answering them through the rings. (A daemon killed while a ring holds a
# request leaves it unanswered: the kernel resends only what was read from
# /dev/fuse; `layerfs daemon --help` says so.)
# Needs root and /dev/fuse; says SKIPPED without them (tests/skip.sh).
# usage: tests/daemon/fuse.sh LAYERFS [io-uring]
set -euo pipefail
layerfs=$(realpath "$1")
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../fusectl.sh"
source "$(dirname "$0")/lib.sh"
route=${2:-dev-fuse}
daemon_scratch "the daemon through FUSE"
uring_param=/sys/module/fuse/parameters/enable_uring uring_was=
daemon_flags=()
case $route in
dev-fuse) ;;
io-uring)
	daemon_flags=(--io-uring)
	if [[ ! -w $uring_param ]]; then
		skip_or_fail "the daemon through FUSE over io_uring" "this kernel has no $uring_param"
		exit 0
	fi
	uring_was=$(cat "$uring_param")
	echo Y >"$uring_param"
	;;
*)
	echo "usage: $0 LAYERFS [io-uring]" >&2
	exit 2
	;;
esac

step "daemon up; a directory and an OCI tarball imported"
start_daemon
base_layers
mkdir -p "$t/w" "$t/w2"

step "create, mount, see both layers, change files"
"$layerfs" create w --from "$base" --from "$top"
"$layerfs" mount w "$t/w" --fuse
mounted "$t/w" || fail "not mounted"
check "$t/w/etc/name" top
[[ -e $t/w/etc/doomed ]] && fail "the tarball's whiteout does not hide etc/doomed"
echo changed >"$t/w/etc/name"
echo new >"$t/w/new"
rm "$t/w/etc/name" && echo again >"$t/w/etc/name"
[[ $(state_of w) == mounted ]] || fail "ls: $("$layerfs" ls)"
# What w changed over its layers: a lower file rewritten (its directory's
# time moved), a file added.
diff=$("$layerfs" diff w)
want=$'C /etc (times)\nC /etc/name (data,times)\nA /new'
[[ $diff == "$want" ]] || fail "layerfs diff w:"$'\n'"$diff"
json=$("$layerfs" --json diff w)
grep -q '"kind": "A"' <<<"$json" || fail "layerfs --json diff w: $json"
# Mounted so that no file in it grants privileges or reaches a device.
opts=$(awk -v m="$t/w" '$2 == m {print $4}' /proc/mounts)
[[ ,$opts, == *,nosuid,* && ,$opts, == *,nodev,* ]] || fail "w is mounted '$opts', not nosuid,nodev"

step "a tarball's devices and FIFOs are kept; the nodev mount keeps the device out of reach"
devices_tarball
devices=$("$layerfs" layer import "$t/devices.tar")
"$layerfs" create dev --from "$devices" >/dev/null
mkdir "$t/dev"
"$layerfs" mount dev "$t/dev" >/dev/null
[[ -c $t/dev/null && $(stat -c %t,%T "$t/dev/null") == 1,3 ]] || fail "dev/null: $(stat -c '%F %t,%T' "$t/dev/null" 2>&1)"
[[ -p $t/dev/pipe ]] || fail "dev/pipe: $(stat -c %F "$t/dev/pipe" 2>&1)"
if err=$(sh -c "echo x >'$t/dev/null'" 2>&1); then fail "a device in a workspace was opened"; fi
# nodev: the kernel refuses the open (EACCES) before the door is asked.
[[ $err == *"Permission denied"* ]] || fail "opening a device in a nodev workspace said: $err"
"$layerfs" unmount dev >/dev/null

step "create --mount: made and mounted in one request; a mount that fails leaves no workspace"
mkdir "$t/one"
out=$("$layerfs" create one --from "$base" --from "$top" --mount "$t/one" --fuse)
[[ $out == *"mounted one on $t/one (fuse)"* ]] || fail "create --mount said: $out"
mounted "$t/one" || fail "create --mount did not mount"
check "$t/one/etc/name" top
[[ $(state_of one) == mounted ]] || fail "ls: $("$layerfs" ls)"
"$layerfs" rm --force one >/dev/null
mounted "$t/one" && fail "rm --force left the mount"
touch "$t/one/occupied"
refused "not empty" "$layerfs" create two --from "$base" --mount "$t/one"
listing=$("$layerfs" ls) || fail "ls after a create whose mount failed"
awk '$1 == "two" {f=1} END {exit f}' <<<"$listing" || fail "a workspace whose mount failed was kept: $listing"
[[ ! -e $LAYERFS_STORE/workspaces/two ]] || fail "a workspace whose mount failed left its directory"
refused "give --mount DIR too" "$layerfs" create three --from "$base" --fuse
rm -r "$t/one"

step "reset while mounted: every process sees the layers' contents at once"
"$layerfs" create r --from "$base" --from "$top" >/dev/null
mkdir "$t/r"
"$layerfs" mount r "$t/r" --fuse >/dev/null
# Seen (so cached by the kernel) before and after each change.
cat "$t/r/etc/name" "$t/r/etc/doomed" >/dev/null 2>&1 || true
echo rewritten >"$t/r/etc/name"
mkdir "$t/r/made" && echo x >"$t/r/made/f" && echo y >"$t/r/etc/added"
exec 9<"$t/r/etc/added"
check "$t/r/etc/name" rewritten
ls "$t/r/etc" "$t/r/made" >/dev/null
"$layerfs" reset r /made >/dev/null
[[ -e $t/r/made ]] && fail "made/ is still there after its reset"
check "$t/r/etc/name" rewritten
"$layerfs" reset r >/dev/null
check "$t/r/etc/name" top
[[ -e $t/r/etc/added ]] && fail "etc/added is still there after the reset"
[[ $(ls "$t/r/etc") == name ]] || fail "etc after the reset: $(ls "$t/r/etc")"
[[ $(cat <&9) == y ]] || fail "a descriptor open on a file the reset removed"
exec 9<&-
changes=$("$layerfs" diff r) || fail "diff r after the reset"
[[ -z $changes ]] || fail "changes left after the reset: $changes"
refused 'without `..`' "$layerfs" reset r ../x
"$layerfs" unmount r >/dev/null

step "a 64 MiB workspace: writes stop at ENOSPC, removals free room, the others go on"
"$layerfs" create q --from "$base" --size 64M >/dev/null
mkdir "$t/q"
"$layerfs" mount q "$t/q" --fuse >/dev/null
rc=0
dd if=/dev/zero of="$t/q/fill" bs=1M count=100 2>"$t/dd.err" || rc=$?
[[ $rc != 0 ]] && grep -q "No space left" "$t/dd.err" || fail "writing 100 MiB into 64 MiB: rc $rc, $(cat "$t/dd.err")"
size=$(stat -c %s "$t/q/fill")
[[ $size -gt $((60 << 20)) && $size -le $((64 << 20)) ]] || fail "the filled file holds $size bytes"
# The last room, 4 KiB at a time, then not even a new name fits.
refused "No space left" dd if=/dev/zero of="$t/q/fill" bs=4k count=1000 oflag=append conv=notrunc
refused "No space left" sh -c "echo more >'$t/q/more'"
cat "$t/q/etc/name" >/dev/null || fail "reading at the limit"
grep -q "^q .*/64.0M" <<<"$("$layerfs" ls)" || fail "ls shows no limit: $("$layerfs" ls)"
rm "$t/q/fill"
dd if=/dev/zero of="$t/q/again" bs=1M count=32 conv=fsync status=none || fail "writing after the removal"
# Another workspace, and the host, are not held to it.
dd if=/dev/zero of="$t/w/big" bs=1M count=80 status=none || fail "another workspace was limited"
rm "$t/w/big"
"$layerfs" set q --size none >/dev/null
dd if=/dev/zero of="$t/q/fill" bs=1M count=80 status=none || fail "writing once the limit is lifted"
"$layerfs" unmount q >/dev/null
"$layerfs" rm q >/dev/null

step "a long import leaves the workspaces' requests free"
mkdir -p "$t/bulk"
for d in $(seq 30); do
	mkdir "$t/bulk/d$d"
	(cd "$t/bulk/d$d" && seq 1000 | xargs touch)
done
"$layerfs" layer import "$t/bulk" >/dev/null 2>&1 &
importing=$!
for _ in $(seq 200); do [[ -n $(ls "$LAYERFS_STORE/staging" 2>/dev/null) ]] && break; sleep 0.01; done
"$layerfs" unmount w >/dev/null
"$layerfs" mount w "$t/w" --fuse >/dev/null
"$layerfs" diff w >/dev/null
kill -0 "$importing" 2>/dev/null || fail "the import was over before the mount and diff answered: nothing was shown"
wait "$importing" || fail "the import failed"

step "a long commit of one workspace leaves another workspace's requests free"
"$layerfs" create busy --from w >/dev/null
mkdir "$t/busy"
"$layerfs" mount busy "$t/busy" --fuse >/dev/null
cp -r "$t/bulk/." "$t/busy/"
"$layerfs" commit busy --message "30,000 files" >/dev/null 2>&1 &
committing=$!
# The commit has begun once the new upper is made.
for _ in $(seq 500); do [[ -e $LAYERFS_STORE/workspaces/busy/tree/2 ]] && break; sleep 0.01; done
[[ -e $LAYERFS_STORE/workspaces/busy/tree/2 ]] || fail "the commit of busy did not begin"
"$layerfs" unmount w >/dev/null
"$layerfs" mount w "$t/w" --fuse >/dev/null
"$layerfs" diff w >/dev/null
kill -0 "$committing" 2>/dev/null || fail "the commit was over before w's mount and diff answered: nothing was shown"
wait "$committing" || fail "the commit of busy failed"
"$layerfs" rm --force busy >/dev/null

step "commit; a second workspace from the commit sees the changes"
commit=$("$layerfs" commit w --message "first changes")
grep -q "first changes" <<<"$("$layerfs" layer ls)" || fail "layer ls: $("$layerfs" layer ls)"
check "$t/w/etc/name" again
changes=$("$layerfs" diff w) || fail "diff w after the commit"
[[ -z $changes ]] || fail "changes left after the commit: $changes"
"$layerfs" create w2 --from w
"$layerfs" mount w2 "$t/w2"
check "$t/w2/etc/name" again
check "$t/w2/new" new
[[ -e $t/w2/etc/doomed ]] && fail "w2 shows etc/doomed"
refused "is in use by workspaces" "$layerfs" layer rm "$commit"

step "a commit while programs write: the layer holds one moment and never changes again"
# Each a descriptor held across the commit (passed through to the kernel as
# root): a new file, and a committed file appended to (a copy-up).
tree_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0r sha256sum) | sha256sum; }
exec 7>"$t/w/held"
echo before >&7
exec 8>>"$t/w/etc/name"
echo appended >&8
# And a writer appending numbered lines in a loop through the commit.
(
	exec 9>>"$t/w/loop"
	i=0
	while [[ ! -e $t/stop && $i -lt 200000 ]]; do echo $((i++)) >&9; done
) &
writer=$!
for _ in $(seq 100); do [[ -s $t/w/loop ]] && break; sleep 0.05; done
kill -0 "$writer" 2>/dev/null || fail "the looping writer was not running at the commit"
moment=$("$layerfs" commit w --message "while writing" --json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p')
[[ -n $moment ]] || fail "no layer id from the commit"
kill -0 "$writer" 2>/dev/null || fail "the looping writer ended before the commit did: nothing was in flight"
# The layer as the store and w's own stack hold it, just after the commit.
layer_dir=$LAYERFS_STORE/layers/$moment
[[ -d $layer_dir ]] || fail "no $layer_dir"
store_sum=$(tree_sum "$layer_dir")
own=$(ls -d "$LAYERFS_STORE/workspaces/w/tree/"* | sort -V | tail -2 | head -1)
own_sum=$(tree_sum "$own")
echo after >&7
echo later >&8
touch "$t/stop"
wait "$writer"
exec 7>&- 8>&-
[[ $(cat "$layer_dir/held") == before ]] || fail "the layer's held: '$(cat "$layer_dir/held")'"
[[ $(cat "$layer_dir/etc/name") == $'again\nappended' ]] || fail "the layer's etc/name: '$(cat "$layer_dir/etc/name")'"
# The loop's file in the layer is whole lines 0..k-1, one moment of it.
k=$(wc -l <"$layer_dir/loop")
[[ $k -gt 0 ]] || fail "the layer holds none of the loop's lines"
cmp -s "$layer_dir/loop" <(seq 0 $((k - 1))) || fail "the layer's loop is not lines 0..$((k - 1))"
n=$(wc -l <"$t/w/loop")
[[ $n -gt $k ]] || fail "no line written after the commit ($n, $k in the layer)"
cmp -s "$t/w/loop" <(seq 0 $((n - 1))) || fail "the workspace's loop is not lines 0..$((n - 1))"
check "$t/w/held" $'before\nafter'
check "$t/w/etc/name" $'again\nappended\nlater'
# A workspace made from the commit shows the moment; the layers, in the
# store and in w's own stack, are what they were; a workspace made from a
# second commit shows the writes after the first.
"$layerfs" create w3 --from w
mkdir "$t/w3"
"$layerfs" mount w3 "$t/w3"
check "$t/w3/held" before
cmp -s "$t/w3/loop" "$layer_dir/loop" || fail "w3's loop is not the layer's"
echo more >"$t/w/more"
"$layerfs" commit w --message "after the moment" >/dev/null
[[ $(tree_sum "$layer_dir") == "$store_sum" ]] || fail "the store's layer changed after its commit"
[[ $(tree_sum "$own") == "$own_sum" ]] || fail "w's own copy of the layer changed after its commit"
"$layerfs" create w4 --from w
mkdir "$t/w4"
"$layerfs" mount w4 "$t/w4"
check "$t/w4/held" $'before\nafter'
check "$t/w4/etc/name" $'again\nappended\nlater'
cmp -s "$t/w4/loop" "$t/w/loop" || fail "w4's loop is not w's"
"$layerfs" unmount w3
"$layerfs" unmount w4

step "twenty more workspaces mounted and used: under 2 MiB and 2 threads each"
rss() { awk '/^VmRSS/ {print $2}' "/proc/$daemon/status"; }
threads() { ls "/proc/$daemon/task" | wc -l; }
rss_before=$(rss) threads_before=$(threads)
for i in $(seq 20); do
	"$layerfs" create "many$i" --from "$base" >/dev/null
	mkdir "$t/many$i"
	"$layerfs" mount "many$i" "$t/many$i" --fuse >/dev/null
	cat "$t/many$i/etc/name" >/dev/null
	echo "$i" >"$t/many$i/mine"
	dd if=/dev/zero of="$t/many$i/big" bs=1M count=2 status=none
done
grown=$(($(rss) - rss_before)) more=$(($(threads) - threads_before))
echo "   20 mounts: daemon RSS +$grown kB, +$more threads"
[[ $grown -lt $((20 * 2048)) ]] || fail "20 mounts grew the daemon by $grown kB"
[[ $more -le 40 ]] || fail "20 mounts added $more threads"
for i in $(seq 20); do "$layerfs" rm --force "many$i" >/dev/null; done

# rings_given: the most requests a daemon's ring logged being given.
rings_given() {
	{ grep -o 'has been given [0-9]* requests' "$t/daemon.log" || true; } | awk '{print $4}' | sort -n | tail -1
}
if [[ $route == io-uring ]]; then
	step "kill -9 with the mounts idle; requests made meanwhile are answered by the next daemon's rings"
	before=$(cat "$t/w/etc/name")
	kill -9 "$daemon"
	wait "$daemon" 2>/dev/null || true
	daemon=
	sleep 0.5
	mounted "$t/w" || fail "w's mount went with the daemon"
	# Each waits in a CPU's queue until a daemon serves it.
	rm -f "$t/gap.out"
	for i in 1 2 3 4; do
		# Only ENOENT is the answer: any other error (ENOTCONN, EIO) is not.
		(err=$(stat "$t/w/never-looked-up-$i" 2>&1 >/dev/null) && echo "found $i" ||
			case $err in *"No such file or directory"*) echo "absent $i" ;; *) echo "error $i: $err" ;; esac) >>"$t/gap.out" &
	done
	(echo made-in-the-gap >"$t/w/made-in-the-gap" && echo made >>"$t/gap.out") &
	sleep 1
	[[ -s $t/gap.out ]] && fail "answered with no daemon running: $(cat "$t/gap.out")"
	start_daemon
	for _ in $(seq 100); do [[ $(wc -l <"$t/gap.out" 2>/dev/null) -ge 5 ]] && break; sleep 0.1; done
	[[ $(sort "$t/gap.out" | tr '\n' ' ') == "absent 1 absent 2 absent 3 absent 4 made " ]] ||
		fail "requests made while no daemon ran: '$(cat "$t/gap.out" 2>/dev/null)' after 10 s"
	check "$t/w/made-in-the-gap" made-in-the-gap
	grep -q "FUSE session taken over" "$t/daemon.log" || fail "the restarted daemon mounted w afresh"
	check "$t/w/etc/name" "$before"
	echo again >"$t/w/after" && check "$t/w/after" again
	given=$(rings_given)
	[[ ${given:-0} -ge 1000 ]] || fail "the daemons' rings were given ${given:-no} requests"
	echo "   the busiest ring was given $given requests (to the nearest power of ten below)"
	if grep -q "does not offer FUSE over io_uring\|not set up" "$t/daemon.log"; then
		fail "a daemon fell back to /dev/fuse: $(grep -m1 'io_uring' "$t/daemon.log")"
	fi
	echo "PASSED: the daemon through FUSE ($route)"
	exit 0
fi
echo "PASSED: the daemon through FUSE ($route)"
