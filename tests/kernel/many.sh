#!/usr/bin/env bash
# Fifty workspaces of one daemon mounted through the Linux kernel NFS client
# at once, run in the QEMU guest by tools/kernel-client/run --no-mount with
# the daemon as its server (`layerfs daemon --store /run/lfs-store
# --nfs-port $NFS_PORT`): each made from one layer, mounted over NFS on its
# own mount point, changed a little and read back through its own mount;
# `layerfs ls` lists them all; the daemon's memory and threads per mounted
# workspace are printed; SIGTERM unmounts all fifty and leaves no mount.
set -euo pipefail
# The guest runs a copy of this file; the repository is the working directory.
source "$PWD/tests/lib.sh"
layerfs=${LAYERFS:-$PWD/target/release/layerfs}
export LAYERFS_STORE=/run/lfs-store
t=/run/lfs-many-test
n=${WORKSPACES:-50}
nfs_mounts() { awk -v t="$t/" '$3 == "nfs" && index($2, t) == 1' /proc/mounts | wc -l; }
status() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
mkdir -p "$t/base/etc"
for _ in $(seq 100); do "$layerfs" ls >/dev/null 2>&1 && break; sleep 0.1; done
pid=$(daemon_pid)
[[ -n $pid ]] || fail "no daemon"

step "$n workspaces from one layer, each mounted over NFS and changed"
for i in $(seq 100); do echo "file $i" >"$t/base/etc/f$i"; done
base=$("$layerfs" layer import "$t/base")
rss0=$(status "$pid" VmRSS) threads0=$(status "$pid" Threads)
start=$EPOCHREALTIME
for i in $(seq "$n"); do
	mkdir -p "$t/m$i"
	"$layerfs" create "w$i" --from "$base" >/dev/null
	"$layerfs" mount "w$i" "$t/m$i" --nfs >/dev/null
	echo "mine $i" >"$t/m$i/mine"
	echo "changed $i" >>"$t/m$i/etc/f$i"
done
made=$(awk -v a="$start" -v b="$EPOCHREALTIME" -v n="$n" 'BEGIN {printf "%d", (b - a) * 1000 / n}')
[[ $(nfs_mounts) == "$n" ]] || fail "$(nfs_mounts) NFS mounts, not $n"
echo "   $n created, mounted and changed: $made ms each (TCG guest)"

step "each mount shows its own changes and the layer, none of the others'"
for i in $(seq "$n"); do
	[[ $(cat "$t/m$i/mine") == "mine $i" ]] || fail "m$i/mine holds '$(cat "$t/m$i/mine")'"
	[[ $(tail -1 "$t/m$i/etc/f$i") == "changed $i" ]] || fail "m$i/etc/f$i lost its append"
	other=$((i % n + 1))
	[[ $(cat "$t/m$i/etc/f$other") == "file $other" ]] || fail "m$i/etc/f$other shows another workspace's change"
done
# Read from the server, not from the guest's page cache.
sync
echo 3 >/proc/sys/vm/drop_caches
for i in 1 $((n / 2)) "$n"; do
	[[ $(cat "$t/m$i/mine") == "mine $i" ]] || fail "m$i/mine after the caches were dropped"
done

step "layerfs ls lists them all; the daemon per mounted workspace"
start=$EPOCHREALTIME
listed=$("$layerfs" ls | awk '$1 ~ /^w[0-9]+$/ && $3 == "mounted"' | wc -l)
took=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%d", (b - a) * 1000}')
[[ $listed == "$n" ]] || fail "ls shows $listed mounted workspaces, not $n: $("$layerfs" ls)"
rss=$(status "$pid" VmRSS) threads=$(status "$pid" Threads)
echo "   ls: $took ms for $n mounted (a process, in a TCG guest)"
echo "   daemon: ${rss0} kB and $threads0 threads before, $rss kB and $threads threads with $n mounted:" \
	"$(((rss - rss0) / n)) kB and $(awk -v a="$threads0" -v b="$threads" -v n="$n" 'BEGIN {printf "%.2f", (b - a) / n}') threads per mounted workspace"

step "SIGTERM unmounts all $n, exits 0"
kill -TERM "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "the daemon still runs 30 s after SIGTERM"
[[ $(nfs_mounts) == 0 ]] || fail "$(nfs_mounts) NFS mounts left after SIGTERM"
echo "PASSED: $n workspaces mounted through the kernel NFS client"
