#!/usr/bin/env bash
# A round trip through libnfs (a userspace NFSv3 client, Debian libnfs-utils):
# copy files in and out of a running `layerfs serve`, list, and compare.
# usage: tests/libnfs.sh [path/to/layerfs]
set -euo pipefail
bin=${1:-target/release/layerfs}
for tool in nfs-cp nfs-ls nfs-cat; do
	command -v "$tool" >/dev/null || { echo "libnfs: $tool missing (apt-get install libnfs-utils)" >&2; exit 1; }
done
work=$(mktemp -d)
server=""
trap '[ -z "$server" ] || kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/export"
"$bin" serve "$work/export" >"$work/banner" 2>"$work/log" &
server=$!
for _ in $(seq 100); do grep -q '^listening on' "$work/banner" && break; sleep 0.1; done
port=$(sed -n 's/^listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$work/banner")
[ -n "$port" ] || { echo "libnfs: server did not start" >&2; cat "$work/log" >&2; exit 1; }
q="?version=3&nfsport=$port&mountport=$port"
url() { echo "nfs://127.0.0.1/$1$q"; }

head -c 0 /dev/urandom >"$work/empty"
head -c 1 /dev/urandom >"$work/one"
head -c 5000000 /dev/urandom >"$work/big"
for f in empty one big; do
	nfs-cp "$work/$f" "$(url "/$f")" >/dev/null
	cmp "$work/$f" "$work/export/$f"                      # the bytes reached the disk
	nfs-cat "$(url "/$f")" | cmp - "$work/$f"              # and come back the same
done
mkdir "$work/export/dir"
echo inside >"$work/export/dir/file"
listing=$(nfs-ls "$(url /)")
for f in empty one big dir; do grep -qw "$f" <<<"$listing" || { echo "libnfs: $f not listed" >&2; exit 1; }; done
[ "$(nfs-cat "$(url /dir/file)")" = inside ]
nfs-cp "$(url /big)" "$work/back" >/dev/null
cmp "$work/back" "$work/big"
# A missing file in a directory that is there: refused by the server with
# NFS3ERR_NOENT (not any failure: a mount that failed would do as well).
if err=$(nfs-cat "$(url /dir/missing)" 2>&1 >/dev/null); then echo "libnfs: reading a missing file succeeded" >&2; exit 1; fi
grep -q "NFS3ERR_NOENT" <<<"$err" || { echo "libnfs: reading a missing file: $err" >&2; exit 1; }
echo "libnfs round trip passed (port $port)"
