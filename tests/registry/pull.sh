#!/usr/bin/env bash
# `layerfs pull` against a real registry (Debian's docker-registry on
# 127.0.0.1), with umoci and skopeo as the independent tools: an image of
# two layers (a whiteout, an opaque directory, a hard link, a symlink, a
# user. xattr, a setuid file of uid 1000) built by umoci and copied in by
# skopeo is pulled, and a workspace made from it shows through FUSE the
# tree `umoci unpack` gives, extended attributes included. A second pull downloads nothing.
# Shapes other tools write are pulled as umoci unpacks them: skopeo's
# zstd:chunked (several frames, a skippable one), gzip in several members,
# PAX sparse files (GNU.sparse 0.0, 0.1, 1.0), a whiteout under a directory
# its layer turned into a file, a last entry without padding or end
# blocks; a blob that is no tar fails in one printable line. A
# two-platform index gives the host's platform or the one asked for, and
# `create --platform` pulls again for a platform the store lacks; a
# blob corrupted in the registry's storage, a diff_id that is not the
# layer's, an unknown media type, a manifest over 4 MiB and a
# registry that wants credentials each fail in one line (and with --json,
# a kind a script can match) and leave no layer
# and no image; `layerfs login` stores credentials in podman's auth file,
# and the pull uses them. Pushes are tests/registry/push.sh; a slow, gone
# or HTTPS registry and a full disk, tests/registry/outages.sh.
# Needs root, /dev/fuse, docker-registry, umoci, skopeo, htpasswd and openssl; says
# SKIPPED without them (tests/skip.sh).
# usage: tests/registry/pull.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/image.sh"
registry_scratch "pulls from a registry"

step "an image of two layers, built by umoci, copied in by skopeo"
two_layer_image

step "pull it; a workspace from it shows umoci's tree through FUSE"
start_daemon
out=$("$layerfs" pull "$plain/test/img:v1" --insecure-registry "$plain")
[[ $out == "$plain/test/img:v1 sha256:"*"(2 layers, 2 downloaded)" ]] || fail "pull said: $out"
"$layerfs" image ls | grep -q "^$plain/test/img:v1 " || fail "image ls: $("$layerfs" image ls)"
"$layerfs" create w --from "$plain/test/img:v1"
mkdir "$t/w"
"$layerfs" mount w "$t/w" --fuse >/dev/null
"$here/tree.py" "$t/w" --xattrs >"$t/got.tree"
diff -u "$t/expected.tree" "$t/got.tree" || fail "the workspace differs from umoci's unpack"
grep -q "etc/keep .*user.origin=b'image'" "$t/got.tree" || fail "etc/keep's user.origin is not shown"
"$layerfs" unmount w >/dev/null

step "a second pull downloads nothing"
out=$("$layerfs" pull "$plain/test/img:v1" --insecure-registry "$plain")
[[ $out == *"(2 layers, 0 downloaded)" ]] || fail "second pull: $out"

step "shapes other tools write: each pulled as umoci unpacks it (zstd:chunked against its gzip source)"
# shape IMAGE: pulls IMAGE (downloading each of its layers: none is in the
# store), mounts a workspace of it, and lists its tree into $t/IMAGE.got.
shape() {
	local image=$1 out
	out=$("$layerfs" pull "$plain/test/$image:v1" --insecure-registry "$plain") || fail "pull of the $image image"
	[[ $out =~ \(([0-9]+)\ layers?,\ ([0-9]+)\ downloaded\) && ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]] ||
		fail "the $image image was not all downloaded: $out"
	"$layerfs" create "shape-$image" --from "$plain/test/$image:v1" >/dev/null
	mkdir "$t/shape-$image"
	"$layerfs" mount "shape-$image" "$t/shape-$image" --fuse >/dev/null
	"$here/tree.py" "$t/shape-$image" --xattrs >"$t/$image.got"
	"$layerfs" rm --force "shape-$image" >/dev/null
}
# skopeo's zstd:chunked copy of an image umoci made of files of its own
# (umoci unpacks no zstd): several zstd frames and a skippable one holding
# the table of contents.
umoci init --layout "$t/zsrc"
umoci new --image "$t/zsrc:v1"
umoci unpack --image "$t/zsrc:v1" "$t/zsrc-bundle" >/dev/null
mkdir -p "$t/zsrc-bundle/rootfs/data"
for i in $(seq 40); do head -c $((i * 997)) /dev/urandom >"$t/zsrc-bundle/rootfs/data/f$i"; done
umoci repack --image "$t/zsrc:v1" "$t/zsrc-bundle"
"$here/tree.py" "$t/zsrc-bundle/rootfs" --xattrs >"$t/zstd.want"
skopeo copy -q --dest-compress-format zstd:chunked "oci:$t/zsrc:v1" "oci:$t/zstd:v1"
grep -q "zstd-chunked.manifest-position" "$t"/zstd/blobs/sha256/* || fail "skopeo wrote no zstd:chunked layer"
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/zstd:v1" "docker://$plain/test/zstd:v1"
shape zstd
diff -u "$t/zstd.want" "$t/zstd.got" || fail "the zstd:chunked image differs from umoci's unpack of its source"
for s in members sparse-0.0 sparse-0.1 sparse-1.0 d2f unpadded; do
	"$here/shaped_layer.py" "$t/$s" "$s"
	umoci unpack --image "$t/$s:v1" "$t/$s-bundle" >/dev/null
	"$here/tree.py" "$t/$s-bundle/rootfs" --xattrs >"$t/$s.want"
	skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/$s:v1" "docker://$plain/test/$s:v1"
	shape "$s"
	diff -u "$t/$s.want" "$t/$s.got" || fail "the $s image differs from umoci's unpack"
done
grep -q "^data/holey " "$t/sparse-1.0.got" || fail "the sparse file is not data/holey: $(cat "$t/sparse-1.0.got")"
grep -q "^d2f -" "$t/d2f.got" || fail "d2f is no file: $(cat "$t/d2f.got")"
"$here/shaped_layer.py" "$t/junk" junk
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/junk:v1" "docker://$plain/test/junk:v1"
layers_before_junk=$("$layerfs" layer ls --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
fails "not a tar archive" "$layerfs" pull "$plain/test/junk:v1" --insecure-registry "$plain"
err=$("$layerfs" pull "$plain/test/junk:v1" --insecure-registry "$plain" 2>&1 >/dev/null || true)
if LC_ALL=C grep -q '[^[:print:]]' <<<"$err"; then fail "the junk layer's error holds bytes that do not print: $err"; fi
no_new_layers "$layers_before_junk"

step "a two-platform index: the host's by default, the other when asked"
cd "$t"
umoci config --image oci:v1 --tag arm --architecture arm64 >/dev/null
python3 - "$t/oci" <<-'PY'
	import hashlib, json, os, sys
	layout = sys.argv[1]
	index = json.load(open(f"{layout}/index.json"))
	by_tag = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}
	entries = []
	for tag, arch in (("v1", "amd64"), ("arm", "arm64")):
	    m = dict(by_tag[tag])
	    m.pop("annotations")
	    m["platform"] = {"os": "linux", "architecture": arch}
	    entries.append(m)
	multi = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}).encode()
	digest = hashlib.sha256(multi).hexdigest()
	open(f"{layout}/blobs/sha256/{digest}", "wb").write(multi)
	index["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{digest}", "size": len(multi), "annotations": {"org.opencontainers.image.ref.name": "multi"}})
	json.dump(index, open(f"{layout}/index.json", "w"))
	PY
skopeo copy -q --all --dest-tls-verify=false oci:oci:multi "docker://$plain/test/multi:v1"
cd - >/dev/null
amd=$(skopeo inspect --tls-verify=false --raw "docker://$plain/test/img:v1" | sha256sum | cut -d' ' -f1)
host_arch=$(uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')
out=$("$layerfs" pull "$plain/test/multi:v1" --insecure-registry "$plain")
if [[ $host_arch == amd64 ]]; then
	[[ $out == *"sha256:$amd "* ]] || fail "the host's platform (amd64) was not chosen: $out (amd64 is $amd)"
fi
out=$("$layerfs" pull "$plain/test/multi:v1" --insecure-registry "$plain" --platform linux/arm64)
[[ $out != *"sha256:$amd "* ]] || fail "--platform linux/arm64 gave the amd64 image: $out"
# The store holds the arm64 image now: a workspace asked of amd64 is made
# of the amd64 image, pulled again for it.
digest_of() { "$layerfs" --json image ls | python3 -c '
import json, sys
print(next(i["digest"] for i in json.load(sys.stdin) if i["reference"].endswith(sys.argv[1])))' "$1"; }
arm=$(digest_of /test/multi:v1)
[[ $arm != "sha256:$amd" ]] || fail "the arm64 pull recorded the amd64 image"
"$layerfs" create on-amd --from "$plain/test/multi:v1" --platform linux/amd64 --insecure-registry "$plain" >/dev/null
[[ $(digest_of /test/multi:v1) == "sha256:$amd" ]] ||
	fail "create --platform linux/amd64 used the arm64 image ($(digest_of /test/multi:v1); amd64 is $amd)"
"$layerfs" create on-amd-again --from "$plain/test/multi:v1" --platform linux/amd64 >/dev/null ||
	fail "create --platform of the platform the store holds pulled again"
"$layerfs" rm on-amd >/dev/null
"$layerfs" rm on-amd-again >/dev/null
fails "linux/s390x" "$layerfs" pull "$plain/test/multi:v1" --insecure-registry "$plain" --platform linux/s390x 
layers=$("$layerfs" layer ls --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')

step "bad input: each a one-line error, no layer and no image left"
# A blob whose bytes are not its digest.
cd "$t"
umoci unpack --image oci:v1 bad >/dev/null
echo "a new file" >bad/rootfs/new
umoci repack --image oci:corrupt bad
skopeo copy -q --dest-tls-verify=false oci:oci:corrupt "docker://$plain/test/corrupt:v1"
cd - >/dev/null
newest=$(skopeo inspect --tls-verify=false "docker://$plain/test/corrupt:v1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Layers"][-1].split(":")[1])')
data=$(find "$t/plain" -path "*/blobs/sha256/${newest:0:2}/$newest/data")
[[ -f $data ]] || fail "no blob $newest in the registry's storage"
python3 -c "
import sys
b = bytearray(open(sys.argv[1], 'rb').read()); b[len(b) // 2] ^= 0xff
open(sys.argv[1], 'wb').write(b)" "$data"
fails "does not match its digest" "$layerfs" pull "$plain/test/corrupt:v1" --insecure-registry "$plain"
no_new_layers "$layers"
images=$("$layerfs" image ls) || fail "image ls after a failed pull"
grep -q corrupt <<<"$images" && fail "an image was recorded after a failed pull"
# A config whose diff_id is not the layer's, a layer of an unknown type.
"$here/one_layer.py" "$t/wrongdiff" wrong-diff application/vnd.oci.image.layer.v1.tar+gzip
"$here/one_layer.py" "$t/unknown" right application/vnd.example.thing
skopeo copy -q --dest-tls-verify=false "oci:$t/wrongdiff:v1" "docker://$plain/test/wrongdiff:v1"
skopeo copy -q --dest-tls-verify=false "oci:$t/unknown:v1" "docker://$plain/test/unknown:v1"
fails "not the diff_id" "$layerfs" pull "$plain/test/wrongdiff:v1" --insecure-registry "$plain"
fails "unknown media type" "$layerfs" pull "$plain/test/unknown:v1" --insecure-registry "$plain"
# A manifest larger than 4 MiB, from a registry of the test's own (registry:2
# will not serve one).
huge_port=$(free_port)
"$here/huge_manifest.py" "$huge_port" &
registries+=($!)
for _ in $(seq 50); do
	curl -s "http://127.0.0.1:$huge_port/v2/" >/dev/null 2>&1 && break
	sleep 0.1
done
fails "larger than 4194304 bytes" "$layerfs" pull "127.0.0.1:$huge_port/test/huge:v1" --insecure-registry "127.0.0.1:$huge_port"
no_new_layers "$layers"
# Scripts see each failure's kind.
[[ $(kind_of pull "$plain/test/corrupt:v1" --insecure-registry "$plain") == registry ]] || fail "a corrupt blob is not of kind registry"
[[ $(kind_of pull "$plain/test/multi:v1" --insecure-registry "$plain" --platform linux/s390x) == invalid ]] ||
	fail "a platform the index lacks is not of kind invalid"
[[ $(kind_of image rm "$plain/test/none:v1") == not_found ]] || fail "image rm of no image is not of kind not_found"
# A registry reached over HTTPS when it speaks HTTP: said, not hung.
fails "--insecure-registry" "$layerfs" pull "$plain/test/img:v1"
# No such image.
fails "test/none" "$layerfs" pull "$plain/test/none:v1" --insecure-registry "$plain"

step "a registry that wants credentials: refused without, pulled with podman's auth file"
htpasswd -Bbn tester s3cret >"$t/htpasswd"
start_registry "$t/auth" "auth:
  htpasswd:
    realm: layerfs-test
    path: $t/htpasswd" || fail "the registry did not start"
registries+=($registry_pid)
auth=127.0.0.1:$registry_port
skopeo copy -q --dest-tls-verify=false --dest-creds tester:s3cret "oci:$t/oci:v1" "docker://$auth/private/img:v1"
fails "layerfs login" "$layerfs" pull "$auth/private/img:v1" --insecure-registry "$auth"
[[ $(kind_of pull "$auth/private/img:v1" --insecure-registry "$auth") == unauthorized ]] ||
	fail "a 401 is not of kind unauthorized"
mkdir -p "$t/run/containers"
printf '{"auths": {"other.example": {"auth": "eDp5"}}}\n' >"$t/run/containers/auth.json"
echo s3cret | "$layerfs" login "$auth" --username tester --password-stdin
[[ $(stat -c %a "$t/run/containers/auth.json") == 600 ]] || fail "the auth file is not 0600"
grep -q other.example "$t/run/containers/auth.json" || fail "login dropped another registry's entry"
out=$("$layerfs" pull "$auth/private/img:v1" --insecure-registry "$auth")
[[ $out == *"(2 layers, 0 downloaded)" ]] || fail "pull with credentials: $out"
grep -q s3cret "$t/daemon.log" && fail "the password is in the daemon's log"
echo "registry pulls: ok"
