# What the daemon's FUSE scripts (fuse.sh, takeover.sh, user.sh) share:
# their scratch directory and its cleanup, and the helpers below. Sourced
# after tests/lib.sh, with `layerfs` set.
#
# daemon_scratch NAME: says SKIPPED (as NAME) and exits without root and
# /dev/fuse; else makes $t, a store and runtime directory in it, removed at
# exit with every process and mount the script left.
daemon_scratch() {
	need_root_and_fuse "$1"
	make_scratch daemon
	trap daemon_cleanup EXIT
}
daemon= lister= holder=
daemon_cleanup() {
	[[ -n $lister ]] && kill "$lister" 2>/dev/null
	[[ -n $holder ]] && kill "$holder" 2>/dev/null
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	[[ -n ${NOBODY_PID:-} ]] && kill -TERM "$NOBODY_PID" 2>/dev/null || true
	kill_daemons_under "$t"
	unmount_under "$t"
	# A keeper left by a step that failed holds sessions no daemon serves:
	# a process waiting on one would wait for ever.
	pkill -f "layerfs keeper --store $t/" 2>/dev/null || true
	fuse_errors stop
	rm -rf "$t"
	if [[ -n ${uring_was:-} ]]; then echo "$uring_was" >"$uring_param"; fi
}
# base_layers: layers $base (etc/name "base", etc/doomed) and $top (a
# tarball: etc/name "top", a whiteout of etc/doomed), from $t/base and
# $t/top.
base_layers() {
	mkdir -p "$t/base/etc" "$t/top/etc"
	echo base >"$t/base/etc/name"
	echo doomed >"$t/base/etc/doomed"
	echo top >"$t/top/etc/name"
	touch "$t/top/etc/.wh.doomed"
	tar -C "$t/top" -czf "$t/top.tar.gz" .
	base=$("$layerfs" layer import "$t/base")
	top=$("$layerfs" layer import "$t/top.tar.gz")
	[[ $base != "$top" ]] || fail "two layers got one id"
}
# devices_tarball: $t/devices.tar, of a character device (null) and a FIFO
# (pipe), made in $t/devices.
devices_tarball() {
	mkdir "$t/devices"
	mknod "$t/devices/null" c 1 3
	mkfifo "$t/devices/pipe"
	tar -C "$t/devices" -cf "$t/devices.tar" .
}
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
	"$@" python3 "$(dirname "${BASH_SOURCE[0]}")/held.py" "$dir" "$lower" "$t/held.signal" >"$t/held.out" 2>&1 &
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
	local left s stores=()
	for s in "$t/store" "$t/nobody/store"; do [[ -d $s ]] && stores+=("$s"); done
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
