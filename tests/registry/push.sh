#!/usr/bin/env bash
# `layerfs push` against a real registry (Debian's docker-registry on
# 127.0.0.1), with umoci and skopeo as the independent tools: a workspace
# of a pulled image (tests/registry/image.sh) with a commit (deletions, an
# opaque directory, a hard link, a FIFO) is pushed, and `umoci unpack` of
# what skopeo copies back is the tree the workspace shows; a second push
# uploads nothing; a pushed layer keeps its devices' numbers, and a push of
# work over an image carries the image's config (entrypoint, command,
# environment, directory, user) and history on. Then `image prune` forgets
# the images no workspace is made from, and `system df` agrees.
# Needs root, /dev/fuse, docker-registry, umoci, skopeo, htpasswd and openssl; says
# SKIPPED without them (tests/skip.sh).
# usage: tests/registry/push.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/image.sh"
registry_scratch "pushes to a registry"
two_layer_image
start_daemon
"$layerfs" pull "$plain/test/img:v1" --insecure-registry "$plain" >/dev/null
# The workspace that keeps the image from the prune, and an image of a
# layer of its own that no workspace is made from.
"$layerfs" create w --from "$plain/test/img:v1" >/dev/null
mkdir "$t/w"
"$here/one_layer.py" "$t/own" right application/vnd.oci.image.layer.v1.tar+gzip
skopeo copy -q --dest-tls-verify=false "oci:$t/own:v1" "docker://$plain/test/own:v1"
"$layerfs" pull "$plain/test/own:v1" --insecure-registry "$plain" >/dev/null

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
grep -q '/test/own:v1"' "$t/pruned.json" || fail "an image no workspace uses was kept: $(cat "$t/pruned.json")"
images=$("$layerfs" image ls) || fail "image ls after the prune"
grep -q "/test/img:v1 " <<<"$images" || fail "the image workspace w is made from was pruned: $images"
[[ $("$layerfs" --json system df | json_of '["images"]["reclaimable"]') == 0 ]] || fail "df after the prune: $("$layerfs" system df)"
listed=$("$layerfs" --json layer ls | python3 -c 'import json,sys; print("\n".join(sorted(l["id"] for l in json.load(sys.stdin))))')
[[ $listed == "$(ls "$t/store/layers" | sort)" ]] || fail "layer ls and the store differ after the prune"
"$layerfs" mount w "$t/w" --fuse >/dev/null
"$here/tree.py" "$t/w" --xattrs | diff -u "$t/expected.tree" - || fail "w after the prune"
"$layerfs" unmount w >/dev/null
echo "registry pushes: ok"
