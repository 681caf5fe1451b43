# What the test scripts share, sourced by each: failing with a message,
# steps, mount checks, the unmount at exit, and a daemon on a store of the
# script's own. The registry's helpers are in tests/registry/serve.sh,
# FUSE's connection counters in tests/fusectl.sh.
#
# A script sets `layerfs` (the binary) and `t` (its scratch directory, where
# the daemon's log goes) before it calls these.
source "$(dirname "${BASH_SOURCE[0]}")/skip.sh"

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

# stop_daemon [SIGNAL]: stops the daemon start_daemon started (TERM unless
# told) and waits for it to end.
stop_daemon() {
	[[ -n ${daemon:-} ]] || return 0
	kill -"${1:-TERM}" "$daemon" 2>/dev/null || true
	wait "$daemon" 2>/dev/null || true
	daemon=
}
