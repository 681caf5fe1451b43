#!/usr/bin/env bash
# Serves an export for a kernel-client workload on the host filesystem
# named, prepared the first time (so a restart serves the same files):
#   tmpfs    a fresh tmpfs (the guest's /run)
#   overlay  the guest's /tmp: an overlay of a 9p lower and a tmpfs upper,
#            which renumbers directories when their cache entries go
#   ext4     an ext4 loop image
# With `stack`, a three-layer workspace (tests/kernel/stack.sh) there instead.
# usage: tests/kernel/serve.sh LAYERFS PORT (tmpfs|overlay|ext4) [stack]
set -euo pipefail
layerfs=$1 port=$2 on=$3 what=${4:-flat}
case $on in
tmpfs) base=/run/on-tmpfs ;;
overlay) base=/tmp/on-overlay ;;
ext4)
	base=/run/on-ext4
	if ! mountpoint -q $base; then
		mkdir -p $base
		truncate -s 768M /run/ext4.img
		mkfs.ext4 -q -F /run/ext4.img
		dev=$(losetup -f --show /run/ext4.img)
		for _ in $(seq 50); do [ -b "$dev" ] && break; sleep 0.1; done
		mount -t ext4 "$dev" $base
	fi
	;;
*) echo "serve.sh: unknown filesystem $on" >&2; exit 2 ;;
esac
if [[ $what == stack ]]; then
	exec "$(dirname "$0")/stack.sh" "$layerfs" "$port" "$base/ws"
fi
mkdir -p $base/export
exec "$layerfs" serve --listen "127.0.0.1:$port" $base/export
