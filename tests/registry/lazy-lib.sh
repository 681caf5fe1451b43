# What the lazy-pull scripts (lazy.sh, lazy-lifecycle.sh) share: their
# scratch store, a registry behind the relay that counts what it sends
# (proxy.py), one tree in three forms, and the checks of a lazy pull.
# Sourced after tests/lib.sh, with `layerfs` and `here` set.
source "$here/serve.sh"

# lazy_scratch NAME: says SKIPPED (as NAME) and exits without root, the
# tools and (for FUSE) /dev/fuse; else makes $t and a store in it
# (LAYERFS_LAZY_WAIT=3), and starts a registry behind the counting relay,
# at $reg. LAYERFS_LAZY_DOOR names the door (fuse, or nfs in the QEMU
# guest), LAYERFS_LAZY_DIR where $t goes (default /tmp).
lazy_scratch() {
	need_tools "$1" docker-registry umoci skopeo
	door=${LAYERFS_LAZY_DOOR:-fuse}
	if [[ $(id -u) != 0 || ($door == fuse && ! -c /dev/fuse) ]]; then
		skip_or_fail "$1 ($door)" "needs root, and /dev/fuse for FUSE"
		exit 0
	fi
	make_scratch lazy "${LAYERFS_LAZY_DIR:-/tmp}"
	export LAYERFS_LAZY_WAIT=3
	trap lazy_cleanup EXIT
	start_registry "$t/reg" || fail "the registry did not start"
	pids+=($registry_pid)
	reg_port=$registry_port
	port=$(free_port)
	reg=127.0.0.1:$port
	start_proxy
}
daemon= pids=() proxy=
lazy_cleanup() {
	[[ -n $daemon ]] && kill -KILL "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
	pkill -KILL -f "layerfs keeper .*$t" 2>/dev/null || true
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	kill_daemons_under "$t"
	unmount_under "$t"
	rm -rf "$t"
}
# start_proxy [ARGS]: the counting relay, on $port (the same one each time).
start_proxy() {
	"$here/proxy.py" "$port" "$reg_port" "$t/stats.json" "$@" &
	proxy=$!
	pids+=($proxy)
	wait_port "$port" || fail "the relay does not listen on $port"
}
stop_proxy() { kill "$proxy"; wait "$proxy" 2>/dev/null || true; }
stat_of() { python3 -c "import json; print(json.load(open('$t/stats.json'))['$1'])"; }
sent() { stat_of bytes; }

# three_forms: one tree in three forms, each in the registry as
# lazy/FORM:v1: gzip (umoci, gz), zstd:chunked (skopeo, zc) and eStargz
# (estargz.py, es); `umoci unpack` of it in $t/want/rootfs, its listing in
# $t/{gzip,zstd,estargz}.want.
three_forms() {
	cd "$t"
	umoci init --layout gz >/dev/null
	umoci new --image gz:v1
	umoci unpack --image gz:v1 bundle >/dev/null
	r=bundle/rootfs
	mkdir -p $r/lib/a $r/lib/b $r/bin
	for i in $(seq 120); do head -c $((RANDOM % 20000 + 1)) /dev/urandom >$r/lib/a/m$i.py; done
	for i in $(seq 40); do head -c $((i * 1000)) /dev/urandom >$r/lib/b/d$i.so; done
	head -c 6000000 /dev/urandom >$r/bin/big
	echo 'print("hello")' >$r/bin/hello.py
	ln -s hello.py $r/bin/link
	ln $r/bin/hello.py $r/bin/hard
	: >$r/bin/empty
	chmod 755 $r/bin/hello.py
	# Files whose mode lets no one write, as images hold them (/usr/bin/sudo
	# is 4755, many shipped files 0444 or 0555).
	chmod 444 $r/lib/a/m1.py
	chmod 555 $r/lib/b/d1.so
	chmod 500 $r/bin/big
	umoci repack --image gz:v1 bundle
	umoci unpack --image gz:v1 want >/dev/null
	cd - >/dev/null
	"$here/tree.py" "$t/want/rootfs" >"$t/gzip.want"
	skopeo copy -q --dest-compress-format zstd:chunked "oci:$t/gz:v1" "oci:$t/zc:v1"
	"$here/estargz.py" "$t/want/rootfs" "$t/es" v1 --chunk 1000000
	# Every form reads as the image it was made from: the formats' metadata
	# entries (eStargz's table and landmark) are no files of the tree.
	cp "$t/gzip.want" "$t/zstd.want"
	cp "$t/gzip.want" "$t/estargz.want"
	for form in gz zc es; do
		skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/$form:v1" "docker://$reg/lazy/$form:v1"
	done
}
blob_size() { # the image's one layer blob's size
	python3 -c "
import json, glob
for f in glob.glob('$t/$1/blobs/sha256/*'):
    try: m = json.load(open(f))
    except Exception: continue
    if isinstance(m, dict) and 'layers' in m: print(m['layers'][-1]['size'])"
}

# lazy FORM NAME: pulls FORM on read only, checks what it sends at each step.
lazy() {
	local form=$1 name=$2 size before out ready one all
	size=$(blob_size "$form")
	before=$(sent)
	out=$("$layerfs" pull "$reg/lazy/$form:v1" --insecure-registry "$reg" --on-read 2>&1) || fail "lazy pull of $name"
	ready=$(($(sent) - before))
	echo "   $name: blob $size bytes; ready after $ready bytes ($((ready * 1000 / size))‰)"
	((ready * 20 < size)) || fail "$name: $ready bytes sent before the workspace was ready (blob $size)"
	[[ $out == *"lazy: 0 of"* ]] || fail "$name: the pull does not say it is lazy: $out"
	"$layerfs" create "w-$form" --from "$reg/lazy/$form:v1" >/dev/null
	mkdir -p "$t/w-$form"
	"$layerfs" mount "w-$form" "$t/w-$form" --$door >/dev/null
	before=$(sent)
	find "$t/w-$form" -exec stat {} + >/dev/null
	ls -lR "$t/w-$form" >/dev/null
	[[ $(sent) == "$before" ]] || fail "$name: find + stat sent $(($(sent) - before)) bytes"
	before=$(sent)
	[[ $(cat "$t/w-$form/bin/hello.py") == 'print("hello")' ]] || fail "$name: bin/hello.py reads wrong"
	one=$(($(sent) - before))
	echo "   $name: a 15-byte file's read sent $one bytes"
	((one > 0 && one < 4096)) || fail "$name: a 15-byte file's read sent $one bytes"
	before=$(sent)
	"$here/tree.py" "$t/w-$form" >"$t/$name.got"
	all=$(($(sent) - before))
	echo "   $name: reading everything sent $all bytes"
	diff -u "$t/$name.want" "$t/$name.got" || fail "$name: the workspace differs from umoci's unpack"
	((all * 10 <= size * 11)) || fail "$name: reading everything sent $all bytes for a blob of $size"
	"$layerfs" image ls | grep -q "^$reg/lazy/$form:v1 .* 100%$" || fail "$name: image ls: $("$layerfs" image ls)"
}

# fails_after_waiting FILE WHY IMAGE: a read of FILE fails as
# docs/registry.md says: EIO once LAYERFS_LAZY_WAIT (3 s) has passed, not
# before, and a log line naming IMAGE.
fails_after_waiting() {
	local file=$1 why=$2 image=$3 logged err start ms
	logged=$(grep -c "cannot fetch a lazy layer's data" "$t/daemon.log" || true)
	start=$(date +%s%N)
	if err=$(cat "$file" 2>&1 >/dev/null); then fail "a read with $why succeeded"; fi
	ms=$((($(date +%s%N) - start) / 1000000))
	echo "   with $why, the read failed after $ms ms: $err"
	[[ $err == *"Input/output error"* ]] || fail "the read with $why said: $err"
	# The kernel may ask a second READ after the first fails: a bound, not a match.
	((ms >= 2900 && ms < 10000)) || fail "the read with $why failed after $ms ms, not after LAYERFS_LAZY_WAIT=3 s"
	grep "cannot fetch a lazy layer's data" "$t/daemon.log" | tail -n +$((logged + 1)) | grep -qF "image=$image" ||
		fail "no log line names the image whose read failed with $why"
}

