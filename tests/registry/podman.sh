#!/usr/bin/env bash
# podman reads what `layerfs push --format zstd:chunked|estargz` writes, in
# parts: a workspace of files of its own (a file of several chunks, small
# ones, an empty one, a symlink, a hard link, a directory of mode 0750) is
# committed and pushed in each lazy form to a docker-registry on 127.0.0.1;
# podman pulls each with partial pulls on (its debug log must say
# "Retrieved partial blob") into a storage of the test's own, and its view
# of the image (`podman image mount`) must equal the workspace. A full pull
# (partial pulls off) must give the same tree.
# Devices are left out: podman 4.3's partial pull drops character devices
# from skopeo's own zstd:chunked images too.
# Needs root, /dev/fuse, docker-registry, skopeo and podman; says SKIPPED
# without them (tests/skip.sh).
# usage: tests/registry/podman.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
need_tools "podman reads layerfs's lazy images" docker-registry skopeo podman
need_root_and_fuse "podman reads layerfs's lazy images"
make_scratch podman
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
start_daemon

step "a workspace pushed as zstd:chunked and as eStargz"
"$layerfs" create w >/dev/null
mkdir "$t/w"
"$layerfs" mount w "$t/w" --fuse >/dev/null
mkdir -p "$t/w/d/e" "$t/w/private"
chmod 0750 "$t/w/private"
head -c 9000000 /dev/urandom >"$t/w/d/big"
for i in $(seq 40); do head -c $((RANDOM % 9000)) /dev/urandom >"$t/w/d/e/f$i"; done
: >"$t/w/d/empty"
echo secret >"$t/w/private/key"
ln -s e/f1 "$t/w/d/link"
ln "$t/w/d/e/f2" "$t/w/d/again"
"$here/tree.py" "$t/w" >"$t/want"
"$layerfs" unmount w >/dev/null
"$layerfs" commit w --message podman >/dev/null
for form in zstd:chunked estargz; do
	out=$("$layerfs" push w "$reg/p/${form%%:*}:v1" --insecure-registry "$reg" --format "$form")
	[[ $out == *"(1 layers, 1 uploaded)" ]] || fail "push --format $form said: $out"
done

# pull PARTIAL NAME: podman pulls $reg/p/NAME:v1 into a storage of its own,
# with partial pulls on or off, and lists the image's tree into $t/NAME.PARTIAL.
pull() {
	local partial=$1 name=$2 root=$t/podman-$2-$1
	cat >"$root.conf" <<CONF
[storage]
driver = "overlay"
runroot = "$root/run"
graphroot = "$root/graph"
[storage.options]
pull_options = {enable_partial_images = "$partial", use_hard_links = "false", ostree_repos = ""}
CONF
	local image=$reg/p/$name:v1
	CONTAINERS_STORAGE_CONF=$root.conf podman --log-level=debug pull --tls-verify=false "$image" \
		>"$root.log" 2>&1 || { tail -5 "$root.log"; fail "podman pull of $image (partial $partial)"; }
	if [[ $partial == true ]]; then
		grep -q "Retrieved partial blob" "$root.log" ||
			{ grep -i "partial" "$root.log" | tail -3; fail "podman pulled $image whole, not in parts"; }
	fi
	local view
	view=$(CONTAINERS_STORAGE_CONF=$root.conf podman image mount "$image") ||
		fail "podman image mount $image"
	"$here/tree.py" "$view" >"$t/$name.$partial"
	CONTAINERS_STORAGE_CONF=$root.conf podman image unmount "$image" >/dev/null || true
}
for name in zstd estargz; do
	step "podman pulls the $name form in parts, and whole: the workspace's tree both times"
	for partial in true false; do
		pull $partial $name
		# Unpacked as a plain tar, an eStargz layer keeps its two entries
		# of metadata as files (umoci and layerfs's own pulls do too); a
		# pull in parts reads the table, which lists neither.
		if [[ $name == estargz && $partial == false ]]; then
			for meta in .no.prefetch.landmark stargz.index.json; do
				grep -q "^$meta -rw" "$t/$name.$partial" || fail "podman's whole pull of the eStargz form has no $meta"
			done
			grep -v -e '^\.no\.prefetch\.landmark ' -e '^stargz\.index\.json ' "$t/$name.$partial" >"$t/$name.files"
			mv "$t/$name.files" "$t/$name.$partial"
		fi
		diff -u "$t/want" "$t/$name.$partial" ||
			fail "podman's view of the $name form (partial pulls $partial) differs from the workspace"
	done
	echo "   $name: $(wc -l <"$t/want") entries alike"
done
