#!/usr/bin/env bash
# The workspace daemon end to end through FUSE on this machine: import a
# directory and an OCI tarball (its devices and FIFOs kept, the device
# out of reach on the nodev mount), make a workspace on both, mount it, change
# files, diff, reset while mounted, a size limit, a long import and a
# long commit of another workspace beside
# other requests, commit (also while programs write: one moment), make a
# second workspace from the commit and see the changes there; twenty more
# mounts within their memory and threads; kill -9 the daemon under a
# reader, a writer and ls and start it again (the mount stays, and none of
# them sees an error), and across that and an upgrade, files held open
# (read, write, append, a shared mapping, one whose name was removed) used,
# opened again while held, and opened, written and copied up once closed
# (tests/daemon/held.py), the removed one let go of after its release;
# SIGTERM leaves no mount and no keeper; the demo; a user who is not root,
# whose daemon is killed under a writer too.
# With io-uring, the daemon runs with --io-uring and the fuse module's
# enable_uring set (put back after): the steps up to the twenty mounts go
# through its rings, whose log must show requests given to them; then a
# kill -9 with the mounts idle, requests made while no daemon runs, and the
# next daemon answering them through the rings. (A daemon killed while a
# ring holds a request leaves it unanswered: the kernel resends only what
# was read from /dev/fuse; `layerfs daemon --help` says so.)
# Needs root and /dev/fuse; says SKIPPED without them (tests/skip.sh).
# usage: tests/daemon/fuse.sh LAYERFS [io-uring]
set -euo pipefail
layerfs=$(realpath "$1")
route=${2:-dev-fuse}
source "$(dirname "$0")/../skip.sh"
source "$(dirname "$0")/../fusectl.sh"
if [[ ! -c /dev/fuse || $(id -u) != 0 ]]; then
	skip_or_fail "the daemon through FUSE" "needs root and /dev/fuse"
	exit 0
fi
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
t=$(mktemp -d /tmp/layerfs-daemon.XXXXXX)
export LAYERFS_STORE=$t/store XDG_RUNTIME_DIR=$t/run
mkdir -m 700 "$t/run"
daemon= lister=
cleanup() {
	[[ -n $lister ]] && kill "$lister" 2>/dev/null
	[[ -n $holder ]] && kill "$holder" 2>/dev/null
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	[[ -n ${NOBODY_PID:-} ]] && kill -TERM "$NOBODY_PID" 2>/dev/null || true
	for m in $(awk -v t="$t/" 'index($2, t) == 1 {print $2}' /proc/mounts); do umount -l "$m"; done
	# A keeper left by a step that failed holds sessions no daemon serves:
	# a process waiting on one would wait for ever.
	pkill -f "layerfs keeper --store $t/" 2>/dev/null || true
	fuse_errors stop
	rm -rf "$t"
	if [[ -n $uring_was ]]; then echo "$uring_was" >"$uring_param"; fi
}
trap cleanup EXIT
step() { printf '== %s\n' "$*"; }
fail() { echo "FAILED: $*"; [[ -f $t/daemon.log ]] && tail -20 "$t/daemon.log"; exit 1; }
mounted() { awk -v m="$1" '$2 == m {f=1} END {exit !f}' /proc/mounts; }
# refused WHAT COMMAND...: COMMAND fails, and what it says holds WHAT (a
# failure for another reason is no refusal).
refused() {
	local what=$1 err
	shift
	if err=$("$@" 2>&1 >/dev/null); then fail "$* succeeded"; fi
	[[ $err == *"$what"* ]] || fail "$*: '$err' does not say '$what'"
}
# The STATE column of workspace $1 in `layerfs ls` (empty if ls fails).
state_of() { "$layerfs" ls | awk -v n="$1" '$1 == n {print $3}'; }
# fuse_errors start|show|stop: the kernel's FUSE requests that ended in an
# error (but ENOSYS and ENODATA, which the door gives as answers), from its
# tracepoints where tracefs has them: what a failure below needs to be
# understood.
tracing=/sys/kernel/tracing tracefs_mounted=
fuse_errors() {
	local end=$tracing/events/fuse/fuse_request_end
	case $1 in
	start)
		if [[ ! -d $tracing/events ]] && grep -qw tracefs /proc/filesystems; then
			mount -t tracefs nodev "$tracing" && tracefs_mounted=1
		fi
		[[ -d $end ]] || return 0
		echo 0 >"$tracing/tracing_on"
		echo >"$tracing/trace"
		echo 'error != 0 && error != -38 && error != -61' >"$end/filter"
		echo 1 >"$end/enable"
		echo 1 >"$tracing/events/fuse/fuse_request_send/enable"
		echo 1 >"$tracing/tracing_on"
		;;
	show)
		[[ -d $end ]] || return 0
		local failed
		failed=$(awk '/fuse_request_end/ {for (i = 1; i <= NF; i++) if ($i == "req") print $(i + 1)}' "$tracing/trace")
		echo "FUSE requests that failed (tracefs):"
		for u in $failed; do grep -E "req $u( |$)" "$tracing/trace" | sed 's/^ */   /'; done
		fuse_errors stop
		;;
	stop)
		[[ -d $end ]] || return 0
		echo 0 >"$end/enable"
		echo 0 >"$tracing/events/fuse/fuse_request_send/enable"
		echo 0 >"$end/filter"
		echo >"$tracing/trace"
		if [[ -n $tracefs_mounted ]]; then umount "$tracing" && tracefs_mounted=; fi
		;;
	esac
}
start_daemon() {
	coproc DAEMON { exec "$layerfs" daemon "${daemon_flags[@]}" 2>>"$t/daemon.log"; }
	daemon=$DAEMON_PID
	local ready
	read -r -t 30 ready <&"${DAEMON[0]}" || fail "the daemon never said it was ready"
	[[ $ready == "layerfs daemon ready"* ]] || fail "first line: $ready"
}
check() { # check FILE CONTENT
	[[ $(cat "$1") == "$2" ]] || fail "$1 holds '$(cat "$1" 2>&1)', not '$2'"
}
# hold DIR LOWER [RUNAS...]: files held open in DIR (tests/daemon/held.py),
# in a process of their own, so that no daemon started meanwhile inherits
# them; `held_go` lets it go on and waits for its verdict.
holder=
hold() {
	local dir=$1 lower=$2
	shift 2
	: >"$t/held.signal"
	chmod 666 "$t/held.signal"
	"$@" python3 "$(dirname "$0")/held.py" "$dir" "$lower" "$t/held.signal" >"$t/held.out" 2>&1 &
	holder=$!
	for _ in $(seq 200); do [[ $(cat "$t/held.signal") == held ]] && return; sleep 0.05; done
	fail "the files were not held: $(cat "$t/held.out")"
}
held_go() { # held_go WHAT
	echo go >"$t/held.signal"
	wait "$holder" || fail "files held across $1: $(cat "$t/held.out")"
	holder=
	# The file removed while open was kept for the restart; its last
	# release (which the kernel sends a moment after the close) lets go.
	local left stores=("$t/store")
	[[ -d $t/nobody/store ]] && stores+=("$t/nobody/store")
	# Where files are kept: a search of the wrong place would find nothing.
	[[ -n $(find "${stores[@]}" -xdev -type d -path '*/state/removed') ]] ||
		fail "no state/removed/ in the stores, ${stores[*]}"
	for _ in $(seq 100); do
		left=$(find "${stores[@]}" -xdev -path '*/state/removed/*')
		[[ -z $left ]] && return
		sleep 0.05
	done
	fail "files removed while open still kept after their release across $1: $left"
}

step "daemon up; a directory and an OCI tarball imported"
start_daemon
mkdir -p "$t/base/etc" "$t/top/etc" "$t/w" "$t/w2"
echo base >"$t/base/etc/name"
echo doomed >"$t/base/etc/doomed"
echo top >"$t/top/etc/name"
touch "$t/top/etc/.wh.doomed"
tar -C "$t/top" -czf "$t/top.tar.gz" .
base=$("$layerfs" layer import "$t/base")
top=$("$layerfs" layer import "$t/top.tar.gz")
[[ $base != "$top" ]] || fail "two layers got one id"

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
mkdir "$t/devices"
mknod "$t/devices/null" c 1 3
mkfifo "$t/devices/pipe"
tar -C "$t/devices" -cf "$t/devices.tar" .
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

step "layerfs demo: a mounted workspace over two generated layers; Ctrl-C removes it all"
coproc DEMO { exec "$layerfs" demo "$t/w" 2>>"$t/daemon.log"; }
demo=$DEMO_PID
diff_line=
while read -r -t 30 line <&"${DEMO[0]}"; do
	[[ $line == *" diff demo" ]] && diff_line=$line
	[[ $line == Ctrl-C* ]] && break
done
[[ ${line:-} == Ctrl-C* ]] || fail "the demo never said how to stop it"
mounted "$t/w" || fail "the demo's workspace is not mounted"
# Its commands run as printed, from a shell with no layerfs on PATH.
[[ -n $diff_line ]] || fail "the demo printed no diff command"
echo mine >"$t/w/notes.txt"
[[ $(env PATH=/usr/bin:/bin bash -c "$diff_line") == "A /notes.txt" ]] ||
	fail "the demo's own command '$diff_line' did not run as printed"
[[ $("$t/w/bin/hello") == "hello from the tools layer" ]] || fail "bin/hello"
[[ -e $t/w/docs/old-notes.txt ]] && fail "the demo's whiteout hides nothing"
kill -INT "$demo"
rc=0
wait "$demo" || rc=$?
[[ $rc == 0 ]] || fail "the demo's exit status $rc after Ctrl-C"
mounted "$t/w" && fail "the demo left its mount"
[[ -e /tmp/layerfs-demo-$demo ]] && fail "the demo left its store"
# Its cleanup does not hang on stdout: with no reader left on its pipe
# (`layerfs demo | tee`, the tee gone first), Ctrl-C still removes it all.
coproc DEMO { exec "$layerfs" demo "$t/w" 2>>"$t/daemon.log"; }
demo=$DEMO_PID
exec {DEMO[0]}<&-
for _ in $(seq 200); do mounted "$t/w" && break; sleep 0.05; done
mounted "$t/w" || fail "the demo with no reader of its stdout did not mount"
sleep 0.5
kill -0 "$demo" 2>/dev/null || fail "the demo with no reader of its stdout ended by itself"
kill -INT "$demo"
rc=0
wait "$demo" || rc=$?
[[ $rc == 0 ]] || fail "the demo with no reader of its stdout: exit status $rc after Ctrl-C"
mounted "$t/w" && fail "the demo with no reader of its stdout left its mount"
[[ -e /tmp/layerfs-demo-$demo ]] && fail "the demo with no reader of its stdout left its store"
step "a user who is not root runs a daemon of their own and mounts through fusermount3"
nobody() { setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$t/nobody" \
	XDG_RUNTIME_DIR="$t/nobody/run" LAYERFS_STORE="$t/nobody/store" "$@"; }
if ! command -v fusermount3 >/dev/null; then
	skip_or_fail "the daemon through FUSE: a user who is not root" "fusermount3 is not installed (apt-get install fuse3)"
elif ! nobody sh -c ': <>/dev/fuse' 2>/dev/null; then
	skip_or_fail "the daemon through FUSE: a user who is not root" "/dev/fuse is not open to users who are not root here (Debian makes it 0666; verify.sh opens it for its run)"
else
	mkdir -p "$t/nobody/run" "$t/nobody/mnt"
	chmod 755 "$t"
	chmod 700 "$t/nobody/run"
	chown -R 65534:65534 "$t/nobody"
	coproc NOBODY { exec setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$t/nobody" \
		XDG_RUNTIME_DIR="$t/nobody/run" LAYERFS_STORE="$t/nobody/store" "$layerfs" daemon 2>>"$t/daemon.log"; }
	read -r -t 30 ready <&"${NOBODY[0]}" || fail "the user's daemon never said it was ready"
	layer=$(nobody "$layerfs" layer import "$t/base")
	nobody "$layerfs" create mine --from "$layer" >/dev/null
	nobody "$layerfs" mount mine "$t/nobody/mnt" >/dev/null || fail "a user's FUSE mount"
	grep -q "^mine .*(fuse)" <<<"$(nobody "$layerfs" ls)" || fail "the default door for a user is not FUSE"
	[[ $(nobody cat "$t/nobody/mnt/etc/name") == base ]] || fail "reading as the user"
	opts=$(awk -v m="$t/nobody/mnt" '$2 == m {print $4}' /proc/mounts)
	[[ ,$opts, == *,nosuid,* && ,$opts, == *,nodev,* ]] || fail "the user's mount is '$opts', not nosuid,nodev"
	# A user's pipes count against pipe-user-pages-soft (16,384 pages by
	# default). Each mount's thread splices READs through a pipe of its
	# own, grown only as far as its READs need, so eighty mounts read
	# cold still get pipes that hold their READs, not two-buffer ones.
	mkdir -p "$t/nobody/wide"
	head -c $((1 << 20)) /dev/urandom >"$t/nobody/wide/big"
	chown -R 65534:65534 "$t/nobody/wide"
	wide=$(nobody "$layerfs" layer import "$t/nobody/wide")
	for i in $(seq 80); do
		nobody "$layerfs" create "wide$i" --from "$wide" >/dev/null
		nobody mkdir "$t/nobody/wide$i"
		nobody "$layerfs" mount "wide$i" "$t/nobody/wide$i" >/dev/null || fail "the user's mount $i of 80"
		nobody cmp -s "$t/nobody/wide$i/big" "$t/nobody/wide/big" || fail "reading the user's mount $i of 80"
	done
	pipes=$(python3 - "$NOBODY_PID" <<'EOF'
import os, sys, fcntl
F_GETPIPE_SZ = 1032
sizes = {}
for fd in os.listdir(f"/proc/{sys.argv[1]}/fd"):
    path = f"/proc/{sys.argv[1]}/fd/{fd}"
    try:
        if os.readlink(path).startswith("pipe:"):
            held = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            sizes[os.fstat(held).st_ino] = fcntl.fcntl(held, F_GETPIPE_SZ)
            os.close(held)
    except OSError:
        pass
grown = sum(1 for s in sizes.values() if s > 65536)
small = sum(1 for s in sizes.values() if s < 65536)
print(grown, small, sorted(set(sizes.values())))
EOF
)
	read -r grown small _ <<<"$pipes"
	echo "   80 mounts of a user read cold: $grown pipes grown, $small smaller than the default (sizes ${pipes#* * })"
	[[ $grown -ge 80 && $small == 0 ]] || fail "a user's 80 mounts: $grown pipes grown, $small smaller than the default"
	for i in $(seq 80); do nobody "$layerfs" rm --force "wide$i" >/dev/null; done
	# The same tarball of devices, imported by the user: the device cannot be
	# made, and the refusal names it; a FIFO alone imports.
	cp "$t/devices.tar" "$t/nobody/devices.tar"
	tar -C "$t/devices" -cf "$t/nobody/fifo.tar" ./pipe
	chown 65534:65534 "$t/nobody/devices.tar" "$t/nobody/fifo.tar"
	if err=$(nobody "$layerfs" layer import "$t/nobody/devices.tar" 2>&1); then
		fail "a user imported a device"
	fi
	[[ $err == *'"./null"'*root* && $(wc -l <<<"$err") == 1 ]] || fail "the user's device import said: $err"
	mkdir "$t/nobody/dev"
	chown 65534:65534 "$t/nobody/dev"
	fifo=$(nobody "$layerfs" layer import "$t/nobody/fifo.tar")
	nobody "$layerfs" create dev --from "$fifo" >/dev/null
	nobody "$layerfs" mount dev "$t/nobody/dev" >/dev/null || fail "the user's mount of the FIFO layer"
	# (Only the user reaches their mount: no allow_other.)
	nobody test -p "$t/nobody/dev/pipe" || fail "the user's FIFO is not a FIFO"
	nobody sh -c "echo mine >'$t/nobody/mnt/new'" || fail "writing as the user"
	nobody "$layerfs" commit mine >/dev/null || fail "a user's commit"
	# Without passthrough every write is a request to the daemon: killed
	# under them, it leaves requests it had read and not answered, which
	# the next daemon is sent again. The writer goes on until told to stop
	# (at most 60 s), so the kill falls while it writes however fast the
	# door is; it says how many lines it wrote, or which call failed.
	fuse_errors start
	nobody python3 -c '
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
end, i = time.monotonic() + 60, 0
while not (i % 100 == 0 and (os.path.exists(sys.argv[2]) or time.monotonic() > end)):
    try:
        os.write(fd, b"%08d\n" % i)
        i += 1
        if i % 500 == 0:
            os.fsync(fd)
    except OSError as e:
        sys.exit("line %d: %s" % (i, e))
os.close(fd)
print(i)
' "$t/nobody/mnt/appended" "$t/nobody/stop" >"$t/nobody/appended.lines" 2>"$t/nobody/appended.err" &
	appender=$!
	for _ in $(seq 100); do [[ $(nobody stat -c %s "$t/nobody/mnt/appended" 2>/dev/null || echo 0) -gt 9000 ]] && break; sleep 0.02; done
	kill -0 "$appender" 2>/dev/null || fail "the user's writer ended before the kill: $(cat "$t/nobody/appended.err")"
	hold "$t/nobody/mnt" new nobody
	kill -9 "$NOBODY_PID"
	wait "$NOBODY_PID" 2>/dev/null || true
	coproc NOBODY { exec setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$t/nobody" \
		XDG_RUNTIME_DIR="$t/nobody/run" LAYERFS_STORE="$t/nobody/store" "$layerfs" daemon 2>>"$t/daemon.log"; }
	read -r -t 30 ready <&"${NOBODY[0]}" || fail "the user's daemon never said it was ready again"
	held_go "the user's daemon's kill -9 and restart"
	sleep 0.2
	touch "$t/nobody/stop"
	if ! wait "$appender"; then
		fuse_errors show
		fail "the user's writer got an error across the kill and restart: $(cat "$t/nobody/appended.err")"
	fi
	fuse_errors stop
	lines=$(cat "$t/nobody/appended.lines")
	((lines > 1000)) || fail "the user's writer wrote only $lines lines"
	nobody cat "$t/nobody/mnt/appended" | cmp - <(python3 -c '
import sys
for i in range(int(sys.argv[1])):
    sys.stdout.write("%08d\n" % i)
' "$lines") || fail "the user's file written across the kill differs from the $lines lines written"
	kill -TERM "$NOBODY_PID"
	wait "$NOBODY_PID" || fail "the user's daemon's exit status after SIGTERM"
	mounted "$t/nobody/mnt" && fail "the user's mount is left after SIGTERM"
fi
echo "PASSED: the daemon through FUSE ($route)"
