#!/usr/bin/env bash
# Many clients of one daemon at once, each on workspaces of its own, for a
# while: create, mount through FUSE, write, commit, write more, reset, diff,
# make a child from the commit, unmount, remove; and a reader listing all of
# it meanwhile. Every step's result is checked where it happens (what a
# file holds after a reset, an empty diff after it, the child showing the
# commit); at the end nothing is left (no workspace, no layer but the base,
# no mount, no directory in the store) and the daemon's resident memory in
# the second half grew by at most a bound over the first half's.
# Needs root and /dev/fuse; says SKIPPED without them (tests/skip.sh).
# usage: tests/daemon/soak.sh LAYERFS [SECONDS] [CLIENTS]   (default 120 s, 16)
set -euo pipefail
layerfs=$(realpath "$1")
seconds=${2:-120}
clients=${3:-16}
source "$(dirname "$0")/../lib.sh"
need_root_and_fuse "the daemon under many clients"
make_scratch soak
daemon=
cleanup() {
	[[ -n ${pids:-} ]] && kill "${pids[@]}" 2>/dev/null || true
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	unmount_under "$t"
	rm -rf "$t"
}
trap cleanup EXIT

start_daemon
mkdir -p "$t/base/etc" "$t/m"
for i in $(seq 50); do echo "base $i" >"$t/base/etc/f$i"; done
base=$("$layerfs" layer import "$t/base")
rss() { awk '/^VmRSS/ {print $2}' "/proc/$daemon/status"; }

# One client's loop; a failure writes why to $t/failed.C and stops it.
client() {
	local c=$1 end=$2 n=0 w m commit
	oops() { echo "client $c, round $n: $*" >"$t/failed.$c"; exit 1; }
	while (($(date +%s) < end)); do
		w=c$c-$n m=$t/m/c$c-$n
		mkdir "$m"
		"$layerfs" create "$w" --from "$base" >/dev/null || oops "create"
		"$layerfs" mount "$w" "$m" --fuse >/dev/null || oops "mount"
		echo "$w" >"$m/mine"
		echo "changed by $w" >>"$m/etc/f1"
		rm "$m/etc/f2"
		commit=$("$layerfs" commit "$w" --message "$w") || oops "commit"
		echo "after the commit" >>"$m/mine"
		echo "more" >"$m/etc/f3"
		"$layerfs" reset "$w" >/dev/null || oops "reset"
		[[ $(cat "$m/mine") == "$w" ]] || oops "mine holds '$(cat "$m/mine")' after the reset"
		[[ $(cat "$m/etc/f3") == "base 3" ]] || oops "etc/f3 holds '$(cat "$m/etc/f3")' after the reset"
		[[ ! -e $m/etc/f2 ]] || oops "etc/f2 came back"
		changes=$("$layerfs" diff "$w") || oops "diff after the reset"
		[[ -z $changes ]] || oops "changes after the reset: $changes"
		"$layerfs" create "$w-child" --from "$w" >/dev/null || oops "create a child"
		changes=$("$layerfs" diff "$w-child") || oops "diff of the child"
		[[ -z $changes ]] || oops "the child has changes of its own: $changes"
		"$layerfs" rm "$w-child" >/dev/null || oops "rm the child"
		[[ $(tail -1 "$m/etc/f1") == "changed by $w" ]] || oops "etc/f1 lost the committed line"
		"$layerfs" unmount "$w" >/dev/null || oops "unmount"
		"$layerfs" rm "$w" >/dev/null || oops "rm"
		"$layerfs" layer rm "$commit" >/dev/null || oops "layer rm $commit"
		rmdir "$m"
		n=$((n + 1))
	done
	echo "$n" >"$t/rounds.$c"
}

start=$(date +%s)
end=$((start + seconds))
pids=()
for c in $(seq "$clients"); do
	client "$c" "$end" &
	pids+=($!)
done
# Meanwhile: `ls` answers, and the daemon's memory is sampled.
samples=() slowest=0
while (($(date +%s) < end)); do
	t0=$(date +%s%N)
	"$layerfs" ls >/dev/null || fail "layerfs ls failed under load"
	ms=$((($(date +%s%N) - t0) / 1000000))
	((ms > slowest)) && slowest=$ms
	samples+=("$(($(date +%s) - start)):$(rss)")
	ls "$t"/failed.* >/dev/null 2>&1 && break
	sleep 2
done
wait "${pids[@]}" 2>/dev/null || true
for f in "$t"/failed.*; do [[ -e $f ]] && fail "$(cat "$f")"; done
rounds=$(cat "$t"/rounds.* | awk '{n += $1} END {print n}')
[[ $(ls "$t"/rounds.* | wc -l) == "$clients" ]] || fail "not every client finished"
# A client that never finished a round checked nothing.
for f in "$t"/rounds.*; do (($(cat "$f") > 0)) || fail "${f##*.}: no round finished in $seconds s"; done

# Nothing left behind.
[[ -z $("$layerfs" ls | tail -n +2) ]] || fail "workspaces left: $("$layerfs" ls)"
[[ $("$layerfs" layer ls | tail -n +2 | wc -l) == 1 ]] || fail "layers left: $("$layerfs" layer ls)"
[[ -z $(ls "$LAYERFS_STORE/workspaces") ]] || fail "directories left in the store: $(ls "$LAYERFS_STORE/workspaces")"
awk -v t="$t/" 'index($2, t) == 1 {print $2; f=1} END {exit f}' /proc/mounts >/dev/null || fail "mounts left"

# Memory: the largest sample of the second half against the first half's.
half=$((seconds / 2)) first=0 second=0
for s in "${samples[@]}"; do
	at=${s%%:*} kb=${s#*:}
	if ((at < half)); then ((kb > first)) && first=$kb; else ((kb > second)) && second=$kb; fi
done
((first > 0 && second > 0)) || fail "the daemon's memory was not sampled in both halves (${#samples[@]} samples)"
echo "$clients clients, $seconds s: $rounds rounds (each: create, mount, write, commit, reset, diff, child, rm)"
echo "layerfs ls under load: slowest $slowest ms"
echo "daemon resident: at most $first kB in the first half, $second kB in the second"
((second <= first + 16384)) || fail "the daemon grew from $first kB to $second kB"
echo "many clients at once: ok"
