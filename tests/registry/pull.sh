#!/usr/bin/env bash
# `layerfs pull` and `push` against a real registry (Debian's docker-registry on
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
# and the pull uses them. A workspace of the pulled image with a commit
# (deletions, an opaque directory, a hard link, a FIFO) is pushed, and
# `umoci unpack` of what skopeo copies back is the tree the workspace
# shows; a second push uploads nothing; a pushed layer keeps its devices'
# numbers, and a push of work over an image carries the image's config
# (entrypoint, command, environment, directory, user) and history on.
# Through a relay that slows the
# registry down: `ls`, `create` and `mount` answer while a pull runs; a
# registry gone mid-layer and a daemon killed -9 mid-pull leave no layer,
# and the next pull finishes. A store on a 20 MiB tmpfs fills during a
# pull: one line, no half layer, and the daemon pulls a smaller image next.
# Over HTTPS, a registry whose certificate a CA of the test's own signed is
# refused until the daemon is given the CA (LAYERFS_REGISTRY_CA).
# Needs root, /dev/fuse, docker-registry, umoci, skopeo, htpasswd and openssl; says
# SKIPPED without them (tests/skip.sh).
# usage: tests/registry/pull.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
for tool in docker-registry umoci skopeo htpasswd openssl; do
	if ! command -v $tool >/dev/null; then
		skip_or_fail "pulls from a registry" "$tool is not installed"
		exit 0
	fi
done
if [[ ! -c /dev/fuse || $(id -u) != 0 ]]; then
	skip_or_fail "pulls from a registry" "needs root and /dev/fuse"
	exit 0
fi
t=$(mktemp -d /tmp/layerfs-registry.XXXXXX)
export LAYERFS_STORE=$t/store XDG_RUNTIME_DIR=$t/run
mkdir -m 700 "$t/run"
daemon= registries=()
cleanup() {
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	for r in "${registries[@]}"; do kill "$r" 2>/dev/null || true; done
	unmount_under "$t"
	rm -rf "$t"
}
trap cleanup EXIT
source "$here/serve.sh"
# fails WHAT COMMAND...: COMMAND fails with one line on stderr holding WHAT.
fails() {
	local what=$1 err
	shift
	if err=$("$@" 2>&1 >/dev/null); then fail "$* succeeded"; fi
	[[ $err == *"$what"* ]] || fail "$*: '$err' does not say '$what'"
	[[ $(printf '%s\n' "$err" | wc -l) == 1 ]] || fail "$*: more than one line: $err"
	echo "   $err"
}
no_new_layers() {
	[[ $("$layerfs" layer ls --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))') == "$1" ]] ||
		fail "the store holds $("$layerfs" layer ls) after a failed pull"
	[[ -z $(ls "$t/store/staging") ]] || fail "staging holds $(ls "$t/store/staging")"
}

step "an image of two layers, built by umoci, copied in by skopeo"
start_registry "$t/plain" || fail "the registry did not start"
registries+=($registry_pid)
plain=127.0.0.1:$registry_port
cd "$t"
umoci init --layout oci
umoci new --image oci:v1
umoci unpack --rootless --image oci:v1 bundle >/dev/null 2>&1 || umoci unpack --image oci:v1 bundle >/dev/null
r=bundle/rootfs
mkdir -p $r/etc $r/gone $r/opaque/sub
echo hello >$r/etc/hello
echo x >$r/gone/x
echo old >$r/opaque/sub/old
echo keep >$r/etc/keep
umoci repack --image oci:v1 bundle
# A repack's layer is against the bundle's unpack: a fresh unpack for the
# second layer.
rm -rf bundle
umoci unpack --image oci:v1 bundle >/dev/null
rm $r/gone/x
rm -rf $r/opaque
mkdir $r/opaque
echo new >$r/opaque/new
ln $r/etc/hello $r/etc/hard
ln -s hello $r/etc/sym
echo suid >$r/suid
chown 1000:1000 $r/suid
chmod 4755 $r/suid
python3 -c "import os; os.setxattr('$r/etc/keep', 'user.origin', b'image')"
umoci repack --image oci:v1 bundle
skopeo copy -q --dest-tls-verify=false oci:oci:v1 "docker://$plain/test/img:v1"
umoci unpack --image oci:v1 expected >/dev/null
cd - >/dev/null
"$here/tree.py" "$t/expected/rootfs" --xattrs >"$t/expected.tree"
[[ $(wc -l <"$t/expected.tree") -ge 8 ]] || fail "umoci's tree is too small: $(cat "$t/expected.tree")"

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
kind_of() { "$layerfs" --json "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"]["kind"])'; }
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

step "push: a workspace of the pulled image and a commit with deletions; umoci unpacks what the workspace shows"
"$layerfs" create p --from "$plain/test/img:v1"
mkdir "$t/p"
"$layerfs" mount p "$t/p" --fuse >/dev/null
rm "$t/p/etc/hello" "$t/p/etc/sym"
rm -rf "$t/p/opaque"
echo changed >"$t/p/etc/keep"
python3 -c "import os; os.setxattr('$t/p/etc/keep', 'user.pushed', b'yes')"
mkdir -p "$t/p/usr/bin"
echo tool >"$t/p/usr/bin/tool"
chmod 755 "$t/p/usr/bin/tool"
ln "$t/p/usr/bin/tool" "$t/p/usr/bin/tool2"
mkfifo "$t/p/fifo"
fails "commit p" "$layerfs" push p "$plain/test/pushed:v1" --insecure-registry "$plain"
"$layerfs" commit p -m "tools, fewer files" >/dev/null
out=$("$layerfs" push p "$plain/test/pushed:v1" --insecure-registry "$plain")
[[ $out == "$plain/test/pushed:v1 sha256:"*"(3 layers, 1 uploaded)" ]] || fail "push said: $out"
"$here/tree.py" "$t/p" --xattrs >"$t/workspace.tree"
skopeo copy -q --src-tls-verify=false "docker://$plain/test/pushed:v1" "oci:$t/back:v1"
umoci unpack --image "$t/back:v1" "$t/back-bundle" >/dev/null
"$here/tree.py" "$t/back-bundle/rootfs" --xattrs >"$t/back.tree"
diff -u "$t/workspace.tree" "$t/back.tree" || fail "umoci's unpack of the pushed image differs from the workspace"
skopeo inspect --tls-verify=false "docker://$plain/test/pushed:v1" >"$t/inspect.json"
python3 - "$t/inspect.json" "$out" <<-'PY'
	import json, sys
	seen = json.load(open(sys.argv[1]))
	assert len(seen["Layers"]) == 3, seen["Layers"]
	assert seen["Digest"] in sys.argv[2], (seen["Digest"], sys.argv[2])
	PY
out=$("$layerfs" push p "$plain/test/pushed:v2" --insecure-registry "$plain")
[[ $out == *"(3 layers, 0 uploaded)" ]] || fail "a second push uploaded: $out"
"$layerfs" unmount p >/dev/null

step "push keeps device numbers, and carries the base image's config and history on"
mkdir -p "$t/devices/dev"
mknod "$t/devices/dev/zero" c 1 5
mknod "$t/devices/dev/loop9" b 7 9
devices=$("$layerfs" layer import "$t/devices")
"$layerfs" push "$devices" "$plain/test/devices:v1" --insecure-registry "$plain" >/dev/null
skopeo copy -q --src-tls-verify=false "docker://$plain/test/devices:v1" "oci:$t/devices-back:v1"
umoci unpack --image "$t/devices-back:v1" "$t/devices-bundle" >/dev/null
[[ $(stat -c '%F %t,%T' "$t/devices-bundle/rootfs/dev/zero") == "character special file 1,5" ]] ||
	fail "dev/zero came back as $(stat -c '%F %t,%T' "$t/devices-bundle/rootfs/dev/zero")"
[[ $(stat -c '%F %t,%T' "$t/devices-bundle/rootfs/dev/loop9") == "block special file 7,9" ]] ||
	fail "dev/loop9 came back as $(stat -c '%F %t,%T' "$t/devices-bundle/rootfs/dev/loop9")"
cd "$t"
umoci config --image oci:v1 --tag cfg --config.entrypoint /bin/app --config.cmd --serve \
	--config.env A=1 --config.workingdir /srv --config.user app >/dev/null
cd - >/dev/null
skopeo copy -q --dest-tls-verify=false "oci:$t/oci:cfg" "docker://$plain/test/cfg:v1"
skopeo inspect --tls-verify=false --config "docker://$plain/test/cfg:v1" >"$t/cfg-base.json"
"$layerfs" create c --from "$plain/test/cfg:v1" --insecure-registry "$plain" >/dev/null
mkdir "$t/c"
"$layerfs" mount c "$t/c" --fuse >/dev/null
echo mine >"$t/c/mine"
"$layerfs" commit c -m "my change" >/dev/null
"$layerfs" unmount c >/dev/null
"$layerfs" push c "$plain/test/cfg-pushed:v1" --insecure-registry "$plain" >/dev/null
skopeo inspect --tls-verify=false --config "docker://$plain/test/cfg-pushed:v1" >"$t/cfg-pushed.json"
python3 - "$t/cfg-base.json" "$t/cfg-pushed.json" <<-'PY' || fail "the pushed config: $(cat "$t/cfg-pushed.json")"
	import json, sys
	base, got = (json.load(open(p)) for p in sys.argv[1:3])
	for key in ("Entrypoint", "Cmd", "WorkingDir", "User"):
	    assert got["config"].get(key) == base["config"][key], (key, got["config"].get(key))
	assert "A=1" in got["config"]["Env"], got["config"]["Env"]
	assert got["history"][: len(base["history"])] == base["history"], got["history"]
	assert len(got["history"]) == len(base["history"]) + 1, got["history"]
	assert got["history"][-1]["comment"] == "my change", got["history"][-1]
	assert len(got["rootfs"]["diff_ids"]) == len(base["rootfs"]["diff_ids"]) + 1
	PY
"$layerfs" rm c >/dev/null
step "image prune forgets the images no workspace is made from, and their layers; system df agrees"
json_of() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }
unused=$("$layerfs" --json system df | json_of '["images"]["reclaimable"]')
((unused > 0)) || fail "system df counts no image to prune: $("$layerfs" system df)"
"$layerfs" --json image prune >"$t/pruned.json"
[[ $(json_of '["images"].__len__()' <"$t/pruned.json") == "$unused" ]] ||
	fail "image prune removed other than the $unused images df counted: $(cat "$t/pruned.json")"
grep -q '/test/members:v1"' "$t/pruned.json" || fail "an image no workspace uses was kept: $(cat "$t/pruned.json")"
images=$("$layerfs" image ls) || fail "image ls after the prune"
grep -q "/test/img:v1 " <<<"$images" || fail "the image workspace w is made from was pruned: $images"
[[ $("$layerfs" --json system df | json_of '["images"]["reclaimable"]') == 0 ]] || fail "df after the prune: $("$layerfs" system df)"
listed=$("$layerfs" --json layer ls | python3 -c 'import json,sys; print("\n".join(sorted(l["id"] for l in json.load(sys.stdin))))')
[[ $listed == "$(ls "$t/store/layers" | sort)" ]] || fail "layer ls and the store differ after the prune"
"$layerfs" mount w "$t/w" --fuse >/dev/null
"$here/tree.py" "$t/w" --xattrs | diff -u "$t/expected.tree" - || fail "w after the prune"
"$layerfs" unmount w >/dev/null

step "a slow pull: other requests answer beside it; the registry gone mid-layer; the daemon killed mid-pull"
cd "$t"
umoci unpack --image oci:v1 big >/dev/null
head -c 24M /dev/urandom >big/rootfs/blob
umoci repack --image oci:big big
skopeo copy -q --dest-tls-verify=false oci:oci:big "docker://$plain/test/big:v1"
cd - >/dev/null
rm -rf "$t/big" "$t/oci"
slow_port=$(free_port)
slow=127.0.0.1:$slow_port
start_slow() { # 4 MB/s: the 24 MiB layer takes about six seconds
	"$here/throttle.py" "$slow_port" "${plain#*:}" 4000000 &
	throttle=$!
	registries+=($throttle)
	wait_port "$slow_port" || fail "the throttling relay did not start"
}
# forget_big: the big image and its own layer out of the store, to be pulled again.
forget_big() {
	local top
	top=$("$layerfs" image ls --json | python3 -c '
import json, sys
for i in json.load(sys.stdin):
    if "/test/big:" in i["reference"]: print(i["layers"][-1])')
	"$layerfs" image rm "$slow/test/big:v1" >/dev/null
	"$layerfs" layer rm "$top" >/dev/null
}
layers_before=$("$layerfs" layer ls --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
start_slow
"$layerfs" pull "$slow/test/big:v1" --insecure-registry "$slow" >"$t/slow.out" 2>&1 &
puller=$!
sleep 2
kill -0 $puller 2>/dev/null || fail "the slow pull was not slow: $(cat "$t/slow.out")"
# ms VAR CMD...: runs CMD (failing the test if it fails or takes over 10 s)
# and sets VAR to its milliseconds; not in $(...), where a failure would
# end only the subshell.
ms() {
	local var=$1 s
	shift
	s=$(date +%s%N)
	timeout 10 "$@" >/dev/null || fail "$* did not answer beside a pull"
	printf -v "$var" %d $((($(date +%s%N) - s) / 1000000))
}
mkdir -p "$t/beside"
ms ls_ms "$layerfs" ls
ms image_ls_ms "$layerfs" image ls
ms create_ms "$layerfs" create beside --from "$plain/test/img:v1"
ms mount_ms "$layerfs" mount beside "$t/beside" --fuse
echo "   beside the pull: ls $ls_ms ms, image ls $image_ls_ms ms, create $create_ms ms, mount $mount_ms ms"
kill -0 $puller 2>/dev/null || fail "the pull ended before the other requests were answered"
wait $puller || fail "the slow pull failed: $(cat "$t/slow.out")"
grep -q "(3 layers, 1 downloaded)" "$t/slow.out" || fail "slow pull: $(cat "$t/slow.out")"
"$layerfs" unmount beside >/dev/null

forget_big
"$layerfs" pull "$slow/test/big:v1" --insecure-registry "$slow" >"$t/slow.out" 2>&1 &
puller=$!
sleep 2
kill $throttle
wait $puller && fail "a pull whose registry went away succeeded"
grep -q "the download broke off" "$t/slow.out" || fail "the registry gone mid-layer: $(cat "$t/slow.out")"
[[ $(wc -l <"$t/slow.out") == 1 ]] || fail "more than one line: $(cat "$t/slow.out")"
echo "   registry gone mid-layer: $(cat "$t/slow.out")"
no_new_layers "$layers_before"
start_slow
out=$("$layerfs" pull "$slow/test/big:v1" --insecure-registry "$slow")
[[ $out == *"(3 layers, 1 downloaded)" ]] || fail "the pull after the registry came back: $out"

forget_big
"$layerfs" pull "$slow/test/big:v1" --insecure-registry "$slow" >"$t/slow.out" 2>&1 &
puller=$!
sleep 2
[[ -n $(ls "$t/store/staging") ]] || fail "nothing staged two seconds into the pull"
kill -9 "$daemon"
wait "$daemon" || true
wait $puller && fail "a pull whose daemon was killed succeeded"
grep -q "the daemon closed the connection" "$t/slow.out" || fail "the daemon killed mid-pull: $(cat "$t/slow.out")"
start_daemon
no_new_layers "$layers_before"
out=$("$layerfs" pull "$slow/test/big:v1" --insecure-registry "$slow")
[[ $out == *"(3 layers, 1 downloaded)" ]] || fail "the pull after the daemon's restart: $out"
step "a disk that fills during a pull: one line, no half layer, the daemon goes on"
mkdir "$t/small" "$t/run-small"
chmod 700 "$t/run-small"
mount -t tmpfs -o size=20m tmpfs "$t/small"
small() { LAYERFS_STORE=$t/small/store XDG_RUNTIME_DIR=$t/run-small "$layerfs" "$@"; }
LAYERFS_STORE=$t/small/store XDG_RUNTIME_DIR=$t/run-small "$layerfs" daemon >"$t/small.ready" 2>>"$t/small.log" &
small_daemon=$!
for _ in $(seq 300); do grep -q ready "$t/small.ready" && break; sleep 0.1; done
grep -q ready "$t/small.ready" || fail "the daemon on a small store did not start"
fails "No space left on device" small pull "$plain/test/big:v1" --insecure-registry "$plain"
[[ $(LAYERFS_STORE=$t/small/store XDG_RUNTIME_DIR=$t/run-small kind_of pull "$plain/test/big:v1" --insecure-registry "$plain") == no_space ]] ||
	fail "a full store is not of kind no_space"
# The layers that finished stay (the next pull needs them); the one cut
# short is nowhere.
[[ -z $(ls "$t/small/store/staging") ]] || fail "a full disk left staging: $(ls "$t/small/store/staging")"
[[ -z $(find "$t/small/store/layers" -name blob) ]] || fail "a full disk left half a layer"
images=$(small image ls) || fail "image ls after a pull onto a full disk"
grep -q big <<<"$images" && fail "an image was recorded on a full disk"
small pull "$plain/test/img:v1" --insecure-registry "$plain" >/dev/null || fail "a smaller pull after the full disk failed"
kill "$small_daemon"
wait "$small_daemon" || true
umount "$t/small"

step "HTTPS with a CA of the test's own and basic auth: refused until the daemon trusts the CA"
mkdir "$t/tls"
(
	cd "$t/tls"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=layerfs test CA" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -keyout reg.key -out reg.csr -subj "/CN=127.0.0.1" 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext
	openssl x509 -req -in reg.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out reg.pem -days 2 -extfile ext 2>/dev/null
)
start_registry "$t/tls-reg" "  tls:
    certificate: $t/tls/reg.pem
    key: $t/tls/reg.key
auth:
  htpasswd:
    realm: layerfs-test
    path: $t/htpasswd" || fail "the registry did not start"
registries+=($registry_pid)
secure=127.0.0.1:$registry_port
skopeo copy -q --dest-tls-verify=false --dest-creds tester:s3cret \
	"docker://$plain/test/img:v1" "docker://$secure/private/img:v1" --src-tls-verify=false
echo s3cret | "$layerfs" login "$secure" --username tester --password-stdin >/dev/null
fails "LAYERFS_REGISTRY_CA" "$layerfs" pull "$secure/private/img:v1"
kill "$daemon"
wait "$daemon" || true
coproc DAEMON { LAYERFS_REGISTRY_CA=$t/tls/ca.pem exec "$layerfs" daemon 2>>"$t/daemon.log"; }
daemon=$DAEMON_PID
read -r -t 30 ready <&"${DAEMON[0]}" || fail "the daemon did not start with a CA"
out=$("$layerfs" pull "$secure/private/img:v1")
[[ $out == "$secure/private/img:v1 sha256:"*"(2 layers, 0 downloaded)" ]] || fail "pull over HTTPS: $out"
echo "registry pulls and pushes: ok"
