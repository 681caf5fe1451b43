# What the test scripts share, sourced by each: failing with a message,
# steps, mount checks, the unmount at exit, and a daemon on a store of the
# script's own. The registry's helpers are in tests/registry/serve.sh,
# FUSE's connection counters in tests/fusectl.sh.
#
# A script sets `layerfs` (the binary) and `t` (its scratch directory, where
# the daemon's log goes) before it calls these.
source "$(dirname "${BASH_SOURCE[0]}")/skip.sh"

# need_tools NAME TOOL...: says SKIPPED (as NAME) and exits unless every
# TOOL is installed.
need_tools() {
	local name=$1 tool
	shift
	for tool; do
		if ! command -v "$tool" >/dev/null; then
			skip_or_fail "$name" "$tool is not installed"
			exit 0
		fi
	done
}

# need_root_and_fuse NAME: says SKIPPED (as NAME) and exits unless this is
# root with /dev/fuse.
need_root_and_fuse() {
	if [[ ! -c /dev/fuse || $(id -u) != 0 ]]; then
		skip_or_fail "$1" "needs root and /dev/fuse"
		exit 0
	fi
}

# make_scratch NAME [DIR]: $t, a new directory layerfs-NAME.* under DIR
# (default /tmp), with the daemon's store (LAYERFS_STORE) and runtime
# directory (XDG_RUNTIME_DIR) in it.
make_scratch() {
	t=$(mktemp -d "${2:-/tmp}/layerfs-$1.XXXXXX")
	export LAYERFS_STORE=$t/store XDG_RUNTIME_DIR=$t/run
	mkdir -m 700 "$t/run"
}

# step WHAT: names the check that follows in the script's output.
step() { printf '== %s\n' "$*"; }

# fail WHY: the script fails, saying why, with the end of the daemon's log.
fail() {
	echo "FAILED: $*"
	if [[ -n ${t:-} && -f $t/daemon.log ]]; then tail -20 "$t/daemon.log"; fi
	exit 1
}

# mounted DIR: whether something is mounted at DIR.
mounted() { awk -v m="$1" '$2 == m {f=1} END {exit !f}' /proc/mounts; }

# unmount_under DIR: detaches every mount under DIR, the deepest first (for
# a script's exit: what is busy goes once its last user leaves).
unmount_under() {
	local m
	for m in $(awk -v t="$1/" 'index($2, t) == 1 {print $2}' /proc/mounts | sort -r); do
		umount -l "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true
	done
}

# start_daemon [FLAGS...]: `layerfs daemon` on the store LAYERFS_STORE names
# (with the script's `daemon_flags`, where it has them), its log appended
# to $t/daemon.log; returns once it says it is ready, its pid in `daemon`.
start_daemon() {
	coproc DAEMON { exec "$layerfs" daemon ${daemon_flags[@]+"${daemon_flags[@]}"} "$@" 2>>"$t/daemon.log"; }
	daemon=$DAEMON_PID
	local ready
	read -r -t 60 ready <&"${DAEMON[0]}" || fail "the daemon never said it was ready"
	[[ $ready == "layerfs daemon ready"* ]] || fail "the daemon's first line: $ready"
}

# daemon_pid: the pid of a running `layerfs daemon`, found without procps
# (which a fresh machine may lack); nothing if none runs.
daemon_pid() {
	local p
	for p in /proc/[0-9]*; do
		[[ $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) == *"layerfs daemon"* ]] && { echo "${p#/proc/}"; return; }
	done
}

# kill_daemons_under DIR: kills every `layerfs daemon` whose store
# (LAYERFS_STORE) lies under DIR, whoever started it: at a script's exit,
# the one a failed step left behind (an upgrade that never took over).
kill_daemons_under() {
	local p
	for p in /proc/[0-9]*; do
		# (2> before <: a process gone meanwhile is no message.)
		[[ $(tr '\0' ' ' 2>/dev/null <"$p/cmdline") == *"layerfs daemon"* ]] || continue
		tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -q "^LAYERFS_STORE=$1/" && kill -KILL "${p#/proc/}" 2>/dev/null
	done
	return 0
}

# stop_daemon [SIGNAL]: stops the daemon start_daemon started (TERM unless
# told) and waits for it to end.
stop_daemon() {
	[[ -n ${daemon:-} ]] || return 0
	kill -"${1:-TERM}" "$daemon" 2>/dev/null || true
	wait "$daemon" 2>/dev/null || true
	daemon=
}
