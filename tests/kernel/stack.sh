#!/usr/bin/env bash
# Serves a three-layer workspace for tests/kernel/layered.sh: makes the
# layers under WS (default /run/ws) the first time, then runs `layerfs serve`
# on them.
# usage: tests/kernel/stack.sh LAYERFS (PORT | --fuse MOUNTPOINT) [WS]
# SERVE_FLAGS, if set, are more flags for `layerfs serve`.
set -euo pipefail
layerfs=$1
if [[ $2 == --fuse ]]; then
	door=(--fuse "$3")
	shift
else
	door=(--listen "127.0.0.1:$2")
fi
ws=${3:-/run/ws}
if [[ ! -d $ws ]]; then
	mkdir -p $ws/l1 $ws/l2 $ws/l3
	# bottom
	l=$ws/l1
	mkdir -p $l/base/dir $l/base/links $l/base/opq $l/lowerdir
	echo bottom >$l/base/keep
	echo held >$l/base/held
	echo held2 >$l/base/held2
	echo gone >$l/base/gone
	for n in a b c; do echo "$n" >"$l/base/dir/$n"; done
	echo linked >$l/base/links/one
	ln $l/base/links/one $l/base/links/two
	echo hidden >$l/base/opq/hidden
	for i in $(seq 1 100); do echo "lower $i" >"$l/lowerdir/f$i"; done
	mkdir $l/lowerdir/sub && echo deep >$l/lowerdir/sub/deep
	head -c 4194304 /dev/urandom >$l/base/big
	ln -s keep $l/base/keep-link
	# middle: replaces, whites out, makes opaque
	l=$ws/l2
	mkdir -p $l/base/dir $l/base/opq
	echo middle >$l/base/keep
	: >$l/base/.wh.gone
	: >$l/base/dir/.wh.b
	: >$l/base/opq/.wh..wh..opq
	echo shown >$l/base/opq/shown
	# top: adds
	l=$ws/l3
	mkdir -p $l/base/dir
	echo top >$l/top-only
	echo d >$l/base/dir/d
	(cd $ws && find l1 l2 l3 -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum >sums)
fi
exec "$layerfs" serve "${door[@]}" \
	--layer $ws/l1 --layer $ws/l2 --layer $ws/l3 --upper $ws/upper ${SERVE_FLAGS:-}
