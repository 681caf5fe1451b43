#!/usr/bin/env bash
# A lazy layer's life beyond its reads, against a real registry (Debian's
# docker-registry on 127.0.0.1) through a relay that counts requests and
# bytes (proxy.py), through FUSE: a daemon killed -9 during completion
# resumes it after a restart without fetching again what it had noted; a
# push of a workspace over a lazy image completes it first, unless the
# registry has its blobs (then they are mounted, and it stays lazy);
# `push --format estargz` and `--format zstd:chunked` make images umoci
# unpacks and that are pulled lazily; a bearer token (from tokens.py) that
# runs out while a workspace lives is renewed with the credentials the
# daemon keeps, which it never logs, and a token service gone fails a read
# after LAYERFS_LAZY_WAIT; an image with no table of contents is pulled
# whole and the pull says so.
# Needs root, /dev/fuse, docker-registry, umoci and skopeo; says SKIPPED
# without them (tests/skip.sh).
# usage: tests/registry/lazy-lifecycle.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/lazy-lib.sh"
LAYERFS_LAZY_DOOR=fuse
lazy_scratch "a lazy layer's life"
three_forms
start_daemon

step "a daemon killed -9 during completion resumes it, fetching again at most what waited to be noted"
# Completion asks 8 MiB of the blob at a time (BATCH in the daemon's
# lazy.rs) and fetches the next while one is written. Written pieces are
# noted together after one sync, once 32 MiB of the blob or a second have
# gone by (NOTE_BYTES, NOTE_AFTER in layerfs-layers' lazy/pieces.rs): a
# kill fetches again at most those and the two batches in flight. A blob
# of 100 MB at 32 MB/s, killed once more than that bound has come: a
# daemon that noted nothing would fetch it all again.
stop_proxy
start_proxy --rate 32000000
bound=$(((32 << 20) + 2 * (8 << 20)))
# Files of its own again: every byte of it has to come from its blob.
mkdir -p "$t/own2"
for i in $(seq 20); do head -c 5000000 /dev/urandom >"$t/own2/f$i"; done
"$here/estargz.py" "$t/own2" "$t/es-slow" v1 --chunk 1000000
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/es-slow:v1" "docker://$reg/lazy/slow:v1"
"$layerfs" layer prune >/dev/null
size=$(blob_size es-slow)
before=$(sent)
"$layerfs" pull "$reg/lazy/slow:v1" --insecure-registry "$reg" >/dev/null
for _ in $(seq 100); do
	(($(sent) - before > bound + (8 << 20))) && break
	sleep 0.1
done
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
got=$(($(sent) - before))
echo "   $got of $size bytes in before the kill"
((got > bound + (8 << 20) && got < size)) || fail "the kill did not land after more than the bound had come ($got of $size)"
# The relay, started again without its rate, counts on from what it sent:
# the total below spans the restart.
stop_proxy
start_proxy
# A new process reopens the half-filled layer: what it noted is not fetched
# again, and its files read right.
start_daemon
for _ in $(seq 100); do
	"$layerfs" image ls | grep -q "^$reg/lazy/slow:v1 .* 100%$" && break
	sleep 0.2
done
"$layerfs" image ls | grep -q "^$reg/lazy/slow:v1 .* 100%$" || fail "completion did not resume: $("$layerfs" image ls)"
total=$(($(sent) - before))
echo "   $total bytes in all for a blob of $size, $((total - got)) of them after the restart"
((total > got)) || fail "nothing was fetched after the restart"
((total <= size + bound)) || fail "$total bytes fetched for a blob of $size: more than what waited to be noted fetched again"
"$layerfs" create w-slow --from "$reg/lazy/slow:v1" >/dev/null
mkdir "$t/w-slow"
"$layerfs" mount w-slow "$t/w-slow" --$door >/dev/null
for i in $(seq 20); do cmp "$t/w-slow/f$i" "$t/own2/f$i" || fail "f$i of the resumed layer reads wrong"; done

step "a push of a workspace over a lazy image completes it first"
"$layerfs" pull "$reg/lazy/es:v1" --insecure-registry "$reg" --on-read >/dev/null
"$layerfs" create w-push --from "$reg/lazy/es:v1" >/dev/null
"$layerfs" push w-push "$reg/lazy/pushed:v1" --insecure-registry "$reg" >/dev/null
skopeo copy -q --src-tls-verify=false "docker://$reg/lazy/pushed:v1" "oci:$t/pushed:v1"
umoci unpack --image "$t/pushed:v1" "$t/pushed" >/dev/null
"$here/tree.py" "$t/pushed/rootfs" >"$t/pushed.got"
diff -u "$t/estargz.want" "$t/pushed.got" || fail "the pushed image differs from the lazy one"

step "a push whose blobs the registry has already mounts them: the lazy layer stays lazy"
mkdir -p "$t/own4/m"
for i in $(seq 8); do head -c 400000 /dev/urandom >"$t/own4/m/f$i"; done
"$here/estargz.py" "$t/own4" "$t/es-mnt" v1 --chunk 200000
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/es-mnt:v1" "docker://$reg/lazy/mnt:v1"
"$layerfs" pull "$reg/lazy/mnt:v1" --insecure-registry "$reg" --on-read >/dev/null
"$layerfs" create w-mnt --from "$reg/lazy/mnt:v1" >/dev/null
size=$(blob_size es-mnt)
before=$(sent)
out=$("$layerfs" push w-mnt "$reg/other/mnt:v1" --insecure-registry "$reg" --format estargz)
got=$(($(sent) - before))
echo "   a push of an untouched lazy image of $size bytes to another repository: $out; $got bytes sent to layerfs"
[[ $out == *"(1 layers, 0 uploaded)" ]] || fail "the push uploaded what the registry has: $out"
((got * 20 < size)) || fail "the push fetched the lazy layer: $got bytes for a blob of $size"
"$layerfs" image ls | grep -q "^$reg/lazy/mnt:v1 .* 0%$" || fail "the push completed the lazy layer: $("$layerfs" image ls)"
skopeo copy -q --src-tls-verify=false "docker://$reg/other/mnt:v1" "oci:$t/other-mnt:v1"
umoci unpack --image "$t/other-mnt:v1" "$t/other-mnt" >/dev/null
cmp "$t/other-mnt/rootfs/m/f5" "$t/own4/m/f5" || fail "the image pushed by mount reads wrong"

step "push --format estargz makes a lazy image: umoci unpacks it, and it is pulled lazily"
# A commit of new files over the lazy image: its layer is written as eStargz
# (the image's own layer is an eStargz blob the registry has already).
mkdir "$t/w-push"
"$layerfs" mount w-push "$t/w-push" --$door >/dev/null
head -c 3000000 /dev/urandom >"$t/w-push/made-big"
for i in $(seq 20); do echo "made $i" >"$t/w-push/made-$i"; done
"$layerfs" unmount w-push >/dev/null
"$layerfs" commit w-push --message made >/dev/null
out=$("$layerfs" push w-push "$reg/lazy/made:v1" --insecure-registry "$reg" --format estargz)
[[ $out == *"(2 layers, 1 uploaded)" ]] || fail "push --format estargz said: $out"
made_layer=$(skopeo inspect --raw --tls-verify=false "docker://$reg/lazy/made:v1" | python3 -c '
import json, sys
l = json.load(sys.stdin)["layers"][1]
assert "containerd.io/snapshot/stargz/toc.digest" in l.get("annotations", {}), "no table digest"
print(l["size"])') || fail "the pushed layer carries no table digest"
skopeo copy -q --src-tls-verify=false "docker://$reg/lazy/made:v1" "oci:$t/made:v1"
umoci unpack --image "$t/made:v1" "$t/made" >/dev/null
# umoci unpacks the eStargz blob as a plain tar: its metadata as files.
"$here/tree.py" "$t/made/rootfs" | grep -v -e '^stargz\.index\.json ' -e '^\.no\.prefetch\.landmark ' >"$t/made.want"
grep -q "^made-big -rw" "$t/made.want" || fail "umoci's unpack of the push lacks made-big"
# The pull of it gives back the committed layer (the format's metadata no
# file of it): gone from the store first, it comes lazily.
committed=$("$layerfs" ls --json | python3 -c 'import json, sys; print(next(w for w in json.load(sys.stdin) if w["name"] == "w-push")["layers"][-1])')
"$layerfs" rm --force w-push >/dev/null
"$layerfs" layer prune >/dev/null
before=$(sent)
out=$("$layerfs" pull "$reg/lazy/made:v1" --insecure-registry "$reg" --on-read)
ready=$(($(sent) - before))
echo "   made: a layer of $made_layer bytes; ready after $ready bytes"
[[ $out == *"(2 layers, 1 downloaded)"* ]] || fail "the pull of the pushed image said: $out"
pulled=$("$layerfs" image ls --json | python3 -c "
import json, sys
print(next(i for i in json.load(sys.stdin) if i['reference'].endswith('/lazy/made:v1'))['layers'][-1])")
[[ $pulled == "$committed" ]] || fail "the pushed eStargz layer came back as $pulled, not the committed $committed"
((ready * 20 < made_layer)) || fail "the pushed eStargz layer was not pulled lazily: $ready of $made_layer bytes"
"$layerfs" create w-made --from "$reg/lazy/made:v1" >/dev/null
mkdir "$t/w-made"
"$layerfs" mount w-made "$t/w-made" --$door >/dev/null
"$here/tree.py" "$t/w-made" >"$t/made.got"
diff -u "$t/made.want" "$t/made.got" || fail "the lazy pull of the pushed eStargz image differs from umoci's unpack"

step "push --format zstd:chunked makes a lazy image: umoci unpacks it, and it is pulled lazily"
# Files of its own, gone from the store once pushed: the pull has to read them back.
"$layerfs" create w-zcpush >/dev/null
mkdir "$t/w-zcpush"
"$layerfs" mount w-zcpush "$t/w-zcpush" --$door >/dev/null
mkdir -p "$t/w-zcpush/d/e"
head -c 9000000 /dev/urandom >"$t/w-zcpush/d/big"
for i in $(seq 30); do head -c $((RANDOM % 5000)) /dev/urandom >"$t/w-zcpush/d/e/f$i"; done
: >"$t/w-zcpush/d/empty"
ln -s e/f1 "$t/w-zcpush/d/link"
ln "$t/w-zcpush/d/e/f2" "$t/w-zcpush/d/again"
"$here/tree.py" "$t/w-zcpush" >"$t/madezc.want"
"$layerfs" unmount w-zcpush >/dev/null
"$layerfs" commit w-zcpush --message zc >/dev/null
out=$("$layerfs" push w-zcpush "$reg/lazy/madezc:v1" --insecure-registry "$reg" --format zstd:chunked)
[[ $out == *"(1 layers, 1 uploaded)" ]] || fail "push --format zstd:chunked said: $out"
zc_layer=$(skopeo inspect --raw --tls-verify=false "docker://$reg/lazy/madezc:v1" | python3 -c '
import json, sys
l = json.load(sys.stdin)["layers"][0]
assert l["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd", l["mediaType"]
assert "io.github.containers.zstd-chunked.manifest-checksum" in l.get("annotations", {}), "no table checksum"
print(l["size"])') || fail "the pushed layer is not zstd:chunked"
# umoci here reads no zstd: skopeo decompresses the layer (with a zstd
# decoder of its own) into gzip for it.
skopeo copy -q --src-tls-verify=false --dest-compress --dest-compress-format gzip \
	"docker://$reg/lazy/madezc:v1" "oci:$t/madezc:v1"
umoci unpack --image "$t/madezc:v1" "$t/madezc" >/dev/null
"$here/tree.py" "$t/madezc/rootfs" >"$t/madezc.umoci"
diff -u "$t/madezc.want" "$t/madezc.umoci" || fail "umoci's unpack of the zstd:chunked push differs from the workspace"
"$layerfs" rm --force w-zcpush >/dev/null
"$layerfs" layer prune >/dev/null
before=$(sent)
"$layerfs" pull "$reg/lazy/madezc:v1" --insecure-registry "$reg" --on-read >/dev/null ||
	fail "the lazy pull of the pushed zstd:chunked image"
ready=$(($(sent) - before))
echo "   madezc: a layer of $zc_layer bytes; ready after $ready bytes"
((ready * 20 < zc_layer)) || fail "the pushed zstd:chunked layer was not pulled lazily: $ready of $zc_layer bytes"
"$layerfs" create w-madezc --from "$reg/lazy/madezc:v1" >/dev/null
mkdir "$t/w-madezc"
"$layerfs" mount w-madezc "$t/w-madezc" --$door >/dev/null
before=$(sent)
"$here/tree.py" "$t/w-madezc" >"$t/madezc.got"
read_all=$(($(sent) - before))
echo "   madezc: reading everything sent $read_all bytes"
diff -u "$t/madezc.want" "$t/madezc.got" || fail "the lazy pull of the pushed zstd:chunked image differs from the workspace pushed"
((read_all > 9000000)) || fail "reading the zstd:chunked image back sent only $read_all bytes"

step "a bearer token that runs out while a workspace lives is renewed, and never logged"
# A registry that wants tokens from tokens.py, which issues them for 4 s.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$t/token.key" -out "$t/token.crt" \
	-days 2 -subj /CN=layerfs-test-token 2>/dev/null
tok_port=$(free_port) tokens=
start_tokens() {
	"$here/tokens.py" "$tok_port" "$t/token.key" "$t/token.crt" tester:s3cret 4 "$t/tokens.json" &
	tokens=$!
	pids+=($tokens)
	wait_port "$tok_port" || fail "the token service does not listen on $tok_port"
}
issued() { python3 -c "import json; print(json.load(open('$t/tokens.json'))['issued'])"; }
start_tokens
start_registry "$t/reg-tok" "auth:
  token:
    realm: http://127.0.0.1:$tok_port/token
    service: layerfs-test
    issuer: layerfs-test
    rootcertbundle: $t/token.crt" || fail "the token registry did not start"
pids+=($registry_pid)
tok_reg_port=$registry_port
tok=127.0.0.1:$tok_reg_port
# Files of its own, one per directory: a read brings no other.
for d in 1 2 3; do mkdir -p "$t/own3/d$d" && head -c 300000 /dev/urandom >"$t/own3/d$d/f"; done
"$here/estargz.py" "$t/own3" "$t/es-tok" v1 --chunk 100000
skopeo copy -q --preserve-digests --dest-tls-verify=false --dest-creds tester:s3cret \
	"oci:$t/es-tok:v1" "docker://$tok/lazy/tok:v1"
echo s3cret | "$layerfs" login "$tok" --username tester --password-stdin >/dev/null
"$layerfs" pull "$tok/lazy/tok:v1" --insecure-registry "$tok" --on-read >/dev/null
"$layerfs" create w-tok --from "$tok/lazy/tok:v1" >/dev/null
mkdir "$t/w-tok"
"$layerfs" mount w-tok "$t/w-tok" --$door >/dev/null
cmp "$t/w-tok/d1/f" "$t/own3/d1/f" || fail "the first read through a token reads wrong"
first=$(issued)
sleep 5
cmp "$t/w-tok/d2/f" "$t/own3/d2/f" || fail "a read after the token ran out reads wrong"
echo "   tokens issued: $first up to the first read, $(issued) after a read past its end"
(($(issued) > first)) || fail "no token was asked for after the first ran out"
python3 - "$t/tokens.json" "$t/daemon.log" <<'PY' || fail "a credential is in the daemon's log"
import json, sys
tokens = json.load(open(sys.argv[1]))["tokens"]
log = open(sys.argv[2], errors="replace").read()
assert "s3cret" not in log and "dGVzdGVyOnMzY3JldA" not in log, "the password"
assert not any(t.split(".")[2] in log for t in tokens), "a token"
PY
kill "$tokens"
wait "$tokens" 2>/dev/null || true
sleep 5
fails_after_waiting "$t/w-tok/d3/f" "the token service gone" "$tok/lazy/tok:v1"
start_tokens
cmp "$t/w-tok/d3/f" "$t/own3/d3/f" || fail "the read after the token service came back"

step "an image with no table of contents is pulled whole, and the pull says so"
cd "$t"
umoci init --layout plain >/dev/null
umoci new --image plain:v1
umoci unpack --image plain:v1 plain-bundle >/dev/null
head -c 1000 /dev/urandom >plain-bundle/rootfs/own
umoci repack --image plain:v1 plain-bundle
cd - >/dev/null
skopeo copy -q --dest-tls-verify=false "oci:$t/plain:v1" "docker://$reg/lazy/plain:v1"
out=$("$layerfs" pull "$reg/lazy/plain:v1" --insecure-registry "$reg" 2>&1)
[[ $out == *"downloaded whole, with no table of contents to pull lazily: sha256:"* ]] || fail "the pull of a gzip image said: $out"
# create --from, pulling as it makes the workspace, says so too.
"$layerfs" image rm "$reg/lazy/plain:v1" >/dev/null
"$layerfs" layer prune >/dev/null
out=$("$layerfs" create w-plain --from "$reg/lazy/plain:v1" --insecure-registry "$reg" 2>&1)
[[ $out == *"downloaded whole, with no table of contents to pull lazily: sha256:"* ]] ||
	fail "create --from of a gzip image said: $out"
echo "a lazy layer's life through $door: all checks passed"
