#!/usr/bin/env bash
# Runs the kernel-client workloads through a FUSE mount on this machine: the
# whole of tests/kernel/workload.sh on a flat directory (`flat`), or
# tests/kernel/layered.sh on a three-layer stack (`stack`), with the data on a
# tmpfs of its own, on a fresh ext4, xfs or btrfs image (`ext4`, `xfs`,
# `btrfs`), or (flat only: a stack refuses it) on an overlay of a tmpfs under
# that ext4, whose directory inode numbers are not kept (`overlay`). Needs root (it mounts,
# drops caches and chowns) and /dev/fuse; says SKIPPED without them
# (tests/skip.sh: a failure with LAYERFS_REQUIRE_MOUNTS=1). With
# `no-passthrough`, every read and write goes through the door, as for a door
# not run as root. With `io-uring`, the door takes requests through FUSE over
# io_uring (the fuse module's enable_uring is set for the run, and put back
# after), and the run fails unless the rings answered them.
# `permissions` runs tests/kernel/permissions.sh (callers who are not root)
# on a flat directory served to every user.
# usage: tests/fuse/run.sh LAYERFS (flat|stack|permissions) [tmpfs|ext4|xfs|btrfs|overlay] [no-passthrough|io-uring]
set -euo pipefail
layerfs=$(realpath "$1") what=$2 on=${3:-tmpfs} mode=${4:-}
case $mode in
no-passthrough) export SERVE_FLAGS=--no-passthrough ;;
io-uring) export SERVE_FLAGS=--io-uring ;;
esac
uring_param=/sys/module/fuse/parameters/enable_uring
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/skip.sh"
check="FUSE $what workload on $on${4:+ ($4)}"
if [[ ! -c /dev/fuse ]]; then
	skip_or_fail "$check" "no /dev/fuse"
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	skip_or_fail "$check" "needs root"
	exit 0
fi
if [[ $mode == io-uring ]]; then
	if [[ ! -w $uring_param ]]; then
		skip_or_fail "$check" "this kernel has no FUSE over io_uring ($uring_param)"
		exit 0
	fi
	uring_was=$(cat "$uring_param")
	echo Y >"$uring_param"
fi
base=$(mktemp -d /tmp/layerfs-fuse.XXXXXX)
case $on in
tmpfs) mount -t tmpfs -o size=2g tmpfs "$base" ;;
ext4 | xfs | btrfs | overlay)
	fs=$on
	[[ $on == overlay ]] && fs=ext4
	if ! command -v "mkfs.$fs" >/dev/null; then
		skip_or_fail "$check" "mkfs.$fs is missing (e2fsprogs, xfsprogs, btrfs-progs)"
		rmdir "$base"
		exit 0
	fi
	image=$(mktemp /tmp/layerfs-fuse-$fs.XXXXXX)
	truncate -s 2G "$image"
	case $fs in
	ext4) mkfs.ext4 -q -F "$image" ;;
	xfs) mkfs.xfs -q -f "$image" ;;
	btrfs) mkfs.btrfs -q -f "$image" >/dev/null ;;
	esac
	if ! mount -o loop "$image" "$base" 2>/dev/null; then
		skip_or_fail "$check" "no loop device (or no $fs in this kernel) to mount the image"
		rm "$image"
		rmdir "$base"
		exit 0
	fi
	rm "$image" # freed once unmounted
	;;
*)
	echo "usage: $0 LAYERFS (flat|stack|permissions) [tmpfs|ext4|xfs|btrfs|overlay] [no-passthrough]" >&2
	exit 2
	;;
esac
mnt=$base/mnt
mkdir "$mnt"
cleanup() {
	pkill -f -- "serve --fuse $mnt" || true
	umount -l "$mnt" 2>/dev/null || true
	umount -l "$base/export" 2>/dev/null || true
	umount -l "$base/lower" 2>/dev/null || true
	umount -l "$base"
	rmdir "$base"
	rm -f /tmp/4k /tmp/1m /tmp/64m /tmp/tree.tar
	if [[ -n ${uring_was:-} ]]; then echo "$uring_was" >"$uring_param"; fi
}
trap cleanup EXIT
case $what in
flat)
	mkdir "$base/export"
	if [[ $on == overlay ]]; then
		mkdir "$base/lower" "$base/upper" "$base/work"
		mount -t tmpfs tmpfs "$base/lower"
		mount -t overlay overlay \
			-o "lowerdir=$base/lower,upperdir=$base/upper,workdir=$base/work" "$base/export"
	fi
	server="exec $layerfs serve --fuse $mnt ${SERVE_FLAGS:-} $base/export"
	workload=workload.sh
	;;
permissions)
	# Served to every user, as callers other than root use it.
	mkdir "$base/export"
	chmod 755 "$base"
	server="exec $layerfs serve --fuse $mnt --allow-other ${SERVE_FLAGS:-} $base/export"
	workload=permissions.sh
	;;
stack)
	server="exec $repo/tests/kernel/stack.sh $layerfs --fuse $mnt $base/ws"
	workload=layered.sh
	export WS=$base/ws
	;;
*)
	echo "usage: $0 LAYERFS (flat|stack|permissions)" >&2
	exit 2
	;;
esac
(eval "$server" >"$base/door.log" 2>&1 &)
for _ in $(seq 100); do
	awk -v m="$mnt" '$2 == m {f=1} END {exit !f}' /proc/mounts && break
	sleep 0.1
done
if ! awk -v m="$mnt" '$2 == m {f=1} END {exit !f}' /proc/mounts; then
	echo "the door did not mount $mnt:"
	cat "$base/door.log"
	exit 1
fi
cd "$repo"
if ! MNT=$mnt DOOR=fuse SERVER=$server bash "tests/kernel/$workload"; then
	echo "-- door log:"
	tail -n 20 "$base/door.log"
	exit 1
fi
# A btrfs subvolume inside the export numbers its inodes apart, as a mount
# would: its files are refused (EXDEV), never taken for the export's files
# of the same numbers, and nothing of it is written.
if [[ $on == btrfs && $what == flat ]]; then
	echo "== a btrfs subvolume inside the export"
	btrfs subvolume create "$base/export/sub" >/dev/null
	for i in $(seq 20); do
		echo "outside $i" >"$base/export/o$i"
		echo "inside $i" >"$base/export/sub/i$i"
	done
	for i in $(seq 20); do
		[[ $(cat "$mnt/o$i") == "outside $i" ]] || { echo "o$i reads $(cat "$mnt/o$i")"; exit 1; }
		if out=$(cat "$mnt/sub/i$i" 2>&1) || [[ $out != *"cross-device"* ]]; then
			echo "sub/i$i: $out (expected EXDEV)"
			exit 1
		fi
		if (echo changed >"$mnt/sub/i$i") 2>/dev/null; then
			echo "sub/i$i was written"
			exit 1
		fi
	done
	[[ $(cat "$base/export/sub/i7") == "inside 7" ]] || { echo "sub/i7 changed on the host"; exit 1; }
	echo "subvolume refused, nothing of it read or written"
fi
# The rings must have answered: the door says at its unmount how many
# requests came through each route (FORGETs and INTERRUPTs, which never
# come through the rings, left out); the first door of the run logs here
# (the workload restarts it). The smallest workload (permissions) makes a
# few hundred; a run through /dev/fuse gives the rings none.
if [[ $mode == io-uring ]]; then
	pkill -TERM -f -- "serve --fuse $mnt" || true
	for _ in $(seq 100); do
		pgrep -f -- "serve --fuse $mnt" >/dev/null || break
		sleep 0.1
	done
	routes=$(sed -n 's/.* unmounted: \([0-9]*\) requests were answered through \/dev\/fuse, \([0-9]*\) through the rings.*/\1 \2/p' "$base/door.log")
	read -r device rings <<<"${routes:-0 0}"
	echo "the door answered $rings requests through the rings, $device through /dev/fuse"
	if ((rings < 100 || device * 10 > rings)); then
		echo "the rings answered next to nothing: requests came through /dev/fuse"
		tail -n 20 "$base/door.log"
		exit 1
	fi
fi
