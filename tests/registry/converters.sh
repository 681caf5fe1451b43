#!/usr/bin/env bash
# Lazy images made by stargz-snapshotter's own converter: ctr-remote, with
# a containerd of the test's own, converts an image that umoci built into
# eStargz (files cut into 1 MiB chunks, a landmark entry) and into
# zstd:chunked (a table whose entries give no `endOffset`). For each form:
# - the converter's blob has what this test is about (the landmark and the
#   chunks in the eStargz table; a zstd:chunked table annotated);
# - a lazy pull reads, through the door, every file as `umoci unpack` of
#   the original image has it: the formats' metadata entries
#   (`stargz.index.json`, the landmarks) are no files of the tree, but a
#   file of that name in a directory is;
# - the lazy layer, and a whole pull of the same form in a store of its
#   own, get the original image's layer id.
# LAYERFS_LAZY_DOOR=nfs mounts through the kernel's NFS client instead
# (tests/kernel/lazy.sh runs it so in the QEMU guest) and leaves out the
# layer ids, which no door changes; LAYERFS_LAZY_DIR is where its files go
# (default /tmp).
# Needs root, /dev/fuse (for FUSE), docker-registry, umoci, skopeo,
# containerd and ctr-remote (Debian's stargz-snapshotter); says SKIPPED
# without them (tests/skip.sh).
# usage: tests/registry/converters.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
need_tools "converters' lazy images" docker-registry umoci skopeo containerd ctr ctr-remote
door=${LAYERFS_LAZY_DOOR:-fuse}
if [[ $(id -u) != 0 || ($door == fuse && ! -c /dev/fuse) ]]; then
	skip_or_fail "converters' lazy images ($door)" "needs root, and /dev/fuse for FUSE"
	exit 0
fi
make_scratch conv "${LAYERFS_LAZY_DIR:-/tmp}"
daemon= pids=()
cleanup() {
	[[ -n $daemon ]] && kill -KILL "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	unmount_under "$t"
	rm -rf "$t"
}
trap cleanup EXIT
source "$here/serve.sh"
start_registry "$t/reg" || fail "the registry did not start"
pids+=($registry_pid)
reg=127.0.0.1:$registry_port

step "an image built by umoci, converted by ctr-remote to eStargz and zstd:chunked"
cd "$t"
umoci init --layout gz >/dev/null
umoci new --image gz:v1
umoci unpack --image gz:v1 bundle >/dev/null
r=bundle/rootfs
mkdir -p $r/lib/a $r/bin $r/doc
for i in $(seq 30); do head -c $((RANDOM % 20000 + 1)) /dev/urandom >$r/lib/a/m$i.py; done
head -c 3500000 /dev/urandom >$r/bin/big
echo 'print("hello")' >$r/bin/hello.py
ln -s hello.py $r/bin/link
ln $r/bin/hello.py $r/bin/hard
: >$r/bin/empty
chmod 555 $r/bin/hello.py
# Named as the formats' metadata, but not at the root: the image's own.
echo '{"not":"a table"}' >$r/doc/stargz.index.json
umoci repack --image gz:v1 bundle
umoci unpack --image gz:v1 want >/dev/null
cd - >/dev/null
"$here/tree.py" "$t/want/rootfs" >"$t/want.txt"
skopeo copy -q --dest-tls-verify=false "oci:$t/gz:v1" "docker://$reg/conv/gz:v1"
mkdir -p "$t/ctd"
cat >"$t/ctd/config.toml" <<EOF
version = 2
root = "$t/ctd/root"
state = "$t/ctd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$t/ctd/sock"
EOF
containerd --config "$t/ctd/config.toml" >"$t/ctd/log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S $t/ctd/sock ]] && break; sleep 0.1; done
ctr=(ctr --address "$t/ctd/sock")
"${ctr[@]}" version >/dev/null || fail "containerd did not start: $(tail -5 "$t/ctd/log")"
# The native snapshotter: no overlay needed to unpack what is pulled.
"${ctr[@]}" images pull --plain-http --snapshotter native "$reg/conv/gz:v1" >/dev/null ||
	fail "ctr pull of the image"
ctr-remote --address "$t/ctd/sock" images convert --oci --estargz --estargz-chunk-size 1048576 \
	"$reg/conv/gz:v1" "$reg/conv/es:v1" >/dev/null || fail "ctr-remote's eStargz conversion"
ctr-remote --address "$t/ctd/sock" images convert --oci --zstdchunked --estargz-chunk-size 1048576 \
	"$reg/conv/gz:v1" "$reg/conv/zc:v1" >/dev/null || fail "ctr-remote's zstd:chunked conversion"
for form in es zc; do
	"${ctr[@]}" images push --plain-http "$reg/conv/$form:v1" >/dev/null || fail "ctr push of the $form form"
done

step "the converter's blobs hold what this test is about"
# (skopeo reads the manifest; the eStargz table is read with Python alone.)
skopeo inspect --raw --tls-verify=false "docker://$reg/conv/zc:v1" | python3 -c '
import json, sys
l = json.load(sys.stdin)["layers"][0]
assert l["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd", l["mediaType"]
assert any(k.endswith("zstd-chunked.manifest-position") for k in l.get("annotations", {})), "no table position"
' || fail "ctr-remote's zstd:chunked layer is not annotated as zstd:chunked"
skopeo copy -q --src-tls-verify=false "docker://$reg/conv/es:v1" "oci:$t/es:v1"
python3 - "$t/es" <<'PY' || fail "ctr-remote's eStargz layer lacks its landmark or chunks"
import glob, gzip, io, json, sys, tarfile
for f in glob.glob(f"{sys.argv[1]}/blobs/sha256/*"):
    blob = open(f, "rb").read()
    if len(blob) < 51 or blob[-51 + 32:-51 + 38] != b"STARGZ":
        continue
    at = int(blob[-51 + 16:-51 + 32], 16)
    toc = json.loads(tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob[at:-51]))).extractfile("stargz.index.json").read())
    names = [e["name"] for e in toc["entries"]]
    chunks = [e for e in toc["entries"] if e["type"] == "chunk"]
    assert ".no.prefetch.landmark" in names or ".prefetch.landmark" in names, names[:5]
    assert chunks, "no chunk entries"
    print(f"   eStargz table: {len(names)} entries, {len(chunks)} chunks, first {names[0]}")
    break
else:
    sys.exit("no eStargz blob")
PY

start_daemon
layers_of() { # the layer ids of image $1, in the store LAYERFS_STORE names
	"$layerfs" image ls --json | python3 -c "
import json, sys
print(' '.join(next(i for i in json.load(sys.stdin) if i['reference'] == sys.argv[1])['layers']))" "$1"
}
declare -A lazy_layer
for form in es zc; do
	name=$([[ $form == es ]] && echo eStargz || echo zstd:chunked)
	step "ctr-remote's $name, lazily through $door: umoci's tree of the original image"
	out=$("$layerfs" pull "$reg/conv/$form:v1" --insecure-registry "$reg" --on-read 2>&1) ||
		fail "the lazy pull of ctr-remote's $name image: $out"
	[[ $out == *"lazy: 0 of"* ]] || fail "ctr-remote's $name image was not pulled lazily: $out"
	lazy_layer[$form]=$(layers_of "$reg/conv/$form:v1")
	"$layerfs" create "w-$form" --from "$reg/conv/$form:v1" >/dev/null
	mkdir "$t/w-$form"
	"$layerfs" mount "w-$form" "$t/w-$form" --$door >/dev/null
	"$here/tree.py" "$t/w-$form" >"$t/$form.got"
	diff -u "$t/want.txt" "$t/$form.got" || fail "$name: the lazy workspace differs from umoci's unpack of the original"
	echo "   $name: $(wc -l <"$t/want.txt") entries as umoci unpacks the original"
	"$layerfs" unmount "w-$form" >/dev/null
	"$layerfs" rm --force "w-$form" >/dev/null
	"$layerfs" image rm "$reg/conv/$form:v1" >/dev/null
	"$layerfs" layer prune >/dev/null
done

# The rest no door changes.
[[ $door == fuse ]] || { echo "converters' lazy images through $door: all checks passed"; exit 0; }

step "the original image's layer id, for each form pulled lazily and whole"
"$layerfs" pull "$reg/conv/gz:v1" --insecure-registry "$reg" >/dev/null
original=$(layers_of "$reg/conv/gz:v1")
"$layerfs" image rm "$reg/conv/gz:v1" >/dev/null
"$layerfs" layer prune >/dev/null
for form in es zc; do
	name=$([[ $form == es ]] && echo eStargz || echo zstd:chunked)
	[[ ${lazy_layer[$form]} == "$original" ]] ||
		fail "$name pulled lazily: layer ${lazy_layer[$form]}, not the original image's $original"
	"$layerfs" pull "$reg/conv/$form:v1" --insecure-registry "$reg" --whole >/dev/null
	[[ $(layers_of "$reg/conv/$form:v1") == "$original" ]] ||
		fail "$name pulled whole: layer $(layers_of "$reg/conv/$form:v1"), not $original"
	[[ -z $(ls "$t/store/lazy") ]] || fail "$name: a --whole pull made a lazy layer"
	"$layerfs" image rm "$reg/conv/$form:v1" >/dev/null
	"$layerfs" layer prune >/dev/null
done
echo "   layer ${original:0:16}: the original, both forms lazily and whole"
echo "converters' lazy images through $door: all checks passed"
