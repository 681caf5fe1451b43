# What the registry pull scripts (pull.sh, push.sh, outages.sh) share: their
# scratch directory and its cleanup, the image they start from, and their
# checks of a failure. Sourced after tests/lib.sh, with `layerfs` and
# `here` set.
source "$here/serve.sh"

# registry_scratch NAME: says SKIPPED (as NAME) and exits without root,
# /dev/fuse and the tools; else makes $t and a store in it, removed at
# exit with the daemon, the registries started ($registries) and the
# mounts under $t.
registry_scratch() {
	need_tools "$1" docker-registry umoci skopeo htpasswd openssl
	need_root_and_fuse "$1"
	make_scratch registry
	trap registry_cleanup EXIT
}
daemon= registries=()
registry_cleanup() {
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	for r in "${registries[@]}"; do kill "$r" 2>/dev/null || true; done
	kill_daemons_under "$t"
	unmount_under "$t"
	rm -rf "$t"
}
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
# kind_of ARGS...: the kind of error `layerfs --json ARGS...` fails with.
kind_of() { "$layerfs" --json "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"]["kind"])'; }

# two_layer_image: a registry of the test's own at $plain, holding
# test/img:v1, two layers built by umoci (a whiteout, an opaque directory,
# a hard link, a symlink, a user. xattr, a setuid file of uid 1000; its
# layout kept in $t/oci, tag v1) and copied in by skopeo; $t/expected.tree
# lists `umoci unpack` of it.
two_layer_image() {
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
}
