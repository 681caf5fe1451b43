#!/usr/bin/env bash
# Lazy pull against a real registry (Debian's docker-registry on 127.0.0.1)
# through a relay that counts requests and bytes (proxy.py). One tree, in
# three forms: gzip (umoci), zstd:chunked (skopeo's copy of it) and eStargz
# (estargz.py, after the published format). For each lazy form, through
# FUSE:
# - the workspace is ready once fewer than 5% of the blob's bytes are sent;
# - find + stat of every file sends nothing more;
# - a read of one small file sends about that file, and a read of the
#   first bytes of a chunked file one chunk;
# - the tree and every file's content equal `umoci unpack` of the image
#   the form was made from (the formats' metadata entries are no files),
#   and reading all of it sends at most 1.1x the blob;
# - the layer gets the id a full pull (--whole) of the same image gives.
# Then: a file both forms hold, read in one, is not fetched for the other;
# a byte corrupted in the registry's copy of the blob fails that read with
# EIO and a log line naming image, layer and piece, and nothing of it is
# kept; a registry gone fails a read after LAYERFS_LAZY_WAIT and the next
# read after it is back works; a daemon killed -9 during completion
# resumes it after a restart without fetching again what it had; a push of
# a workspace over a lazy image completes it first, unless the registry has
# its blobs (then they are mounted, and it stays lazy); `push --format estargz`
# and `--format zstd:chunked` make images umoci unpacks and that are pulled
# lazily; a bearer token (from tokens.py) that runs out while a workspace
# lives is renewed with the credentials the daemon keeps, which it never
# logs, and a token service gone fails a read after LAYERFS_LAZY_WAIT; an
# image with no table of contents is pulled whole and the pull says so; a
# user's daemon pulls lazily and fills files whose mode lets no one write.
# LAYERFS_LAZY_DOOR=nfs mounts through the kernel's NFS client instead
# (tests/kernel/lazy.sh runs it so in the QEMU guest) and leaves out the
# steps no door changes; LAYERFS_LAZY_DIR is where its files go (default
# /tmp).
# Needs root, /dev/fuse (for FUSE), docker-registry, umoci and skopeo; says
# SKIPPED without them (tests/skip.sh).
# usage: tests/registry/lazy.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
for tool in docker-registry umoci skopeo; do
	if ! command -v $tool >/dev/null; then
		skip_or_fail "lazy pulls" "$tool is not installed"
		exit 0
	fi
done
door=${LAYERFS_LAZY_DOOR:-fuse}
if [[ $(id -u) != 0 || ($door == fuse && ! -c /dev/fuse) ]]; then
	skip_or_fail "lazy pulls ($door)" "needs root, and /dev/fuse for FUSE"
	exit 0
fi
t=$(mktemp -d "${LAYERFS_LAZY_DIR:-/tmp}/layerfs-lazy.XXXXXX")
export LAYERFS_STORE=$t/store XDG_RUNTIME_DIR=$t/run LAYERFS_LAZY_WAIT=3
mkdir -m 700 "$t/run"
daemon= pids=()
cleanup() {
	[[ -n $daemon ]] && kill -KILL "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
	pkill -KILL -f "layerfs keeper .*$t" 2>/dev/null || true
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	unmount_under "$t"
	rm -rf "$t"
}
trap cleanup EXIT
source "$here/serve.sh"
start_registry "$t/reg" || fail "the registry did not start"
pids+=($registry_pid)
reg_port=$registry_port
# start_proxy [ARGS]: the counting relay, on $port (the same one each time).
port=$(free_port)
proxy=
start_proxy() {
	"$here/proxy.py" "$port" "$reg_port" "$t/stats.json" "$@" &
	proxy=$!
	pids+=($proxy)
	wait_port "$port" || fail "the relay does not listen on $port"
}
stop_proxy() { kill "$proxy"; wait "$proxy" 2>/dev/null || true; }
stat_of() { python3 -c "import json; print(json.load(open('$t/stats.json'))['$1'])"; }
sent() { stat_of bytes; }
reg=127.0.0.1:$port
start_proxy

step "one tree in three forms: gzip (umoci), zstd:chunked (skopeo), eStargz (estargz.py)"
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
blob_size() { # the image's one layer blob's size
	python3 -c "
import json, glob
for f in glob.glob('$t/$1/blobs/sha256/*'):
    try: m = json.load(open(f))
    except Exception: continue
    if isinstance(m, dict) and 'layers' in m: print(m['layers'][-1]['size'])"
}
start_daemon

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
step "zstd:chunked, lazily through $door"
lazy zc zstd
# Both forms hold one tree, so one layer: gone, the other form starts afresh.
"$layerfs" rm --force w-zc >/dev/null
"$layerfs" image rm "$reg/lazy/zc:v1" >/dev/null
"$layerfs" layer prune >/dev/null
step "eStargz, lazily through $door; its first bytes of a chunked file fetch one chunk"
"$layerfs" pull "$reg/lazy/es:v1" --insecure-registry "$reg" --on-read >/dev/null
"$layerfs" create w-chunk --from "$reg/lazy/es:v1" >/dev/null
mkdir "$t/w-chunk"
"$layerfs" mount w-chunk "$t/w-chunk" --$door >/dev/null
before=$(sent)
head -c 100 "$t/w-chunk/bin/big" >/dev/null
chunk=$(($(sent) - before))
echo "   the first 100 bytes of a 6 MB file sent $chunk bytes"
((chunk > 1000000 && chunk < 1100000)) || fail "the first bytes of bin/big sent $chunk bytes, not one 1 MB chunk"
"$layerfs" rm --force w-chunk >/dev/null
"$layerfs" image rm "$reg/lazy/es:v1" >/dev/null
"$layerfs" layer prune >/dev/null
lazy es estargz

# The rest no door changes, but the corrupted piece and the registry gone.
if [[ $door == fuse ]]; then
step "the same layer ids as a full pull"
# One layer for both forms, pulled lazily (the eStargz form, here) or whole.
ids() { "$layerfs" image ls --json | python3 -c 'import json,sys; print(sorted({l for i in json.load(sys.stdin) for l in i["layers"]}))'; }
lazy_ids=$(ids)
mkdir "$t/full-run"
stop_daemon
LAYERFS_STORE=$t/full-store start_daemon
for form in zc es; do LAYERFS_STORE=$t/full-store "$layerfs" pull "$reg/lazy/$form:v1" --insecure-registry "$reg" --whole >/dev/null; done
full_ids=$(LAYERFS_STORE=$t/full-store ids)
[[ $lazy_ids == "$full_ids" ]] || fail "lazy layers $lazy_ids, full ones $full_ids"
[[ -z $(ls "$t/full-store/lazy") ]] || fail "a --whole pull made lazy layers"
stop_daemon
start_daemon

step "a held file that loses its name reads its data through the door, never its holes"
# FUSE keeps the host file an open holds; a lazy layer's is holes until read.
# (NFS has no opens: its client renames such a file away and reads it by handle.)
stop_daemon
LAYERFS_STORE=$t/held-store start_daemon
LAYERFS_STORE=$t/held-store "$layerfs" pull "$reg/lazy/zc:v1" --insecure-registry "$reg" --on-read >/dev/null ||
	fail "lazy pull into a second store"
LAYERFS_STORE=$t/held-store "$layerfs" create held --from "$reg/lazy/zc:v1" >/dev/null
mkdir "$t/held"
LAYERFS_STORE=$t/held-store "$layerfs" mount held "$t/held" --fuse >/dev/null
python3 - "$t/held" "$t/want/rootfs" <<'PY' || fail "a held lazy file read wrong once its name was gone"
import os, sys
ws, want = sys.argv[1], sys.argv[2]
def held_read(path, lose):
    fd = os.open(os.path.join(ws, path), os.O_RDONLY)
    lose()
    data = b""
    while chunk := os.pread(fd, 1 << 20, len(data)):
        data += chunk
    os.close(fd)
    expected = open(os.path.join(want, path), "rb").read()
    if data != expected:
        zeros = data.count(0)
        sys.exit(f"{path}: {len(data)} bytes read, {zeros} of them zeros, not its {len(expected)} bytes")
    print(f"   {path}: {len(data)} bytes read right after its name was gone")
held_read("bin/big", lambda: os.unlink(os.path.join(ws, "bin/big")))
held_read("lib/b/d40.so", lambda: os.rename(os.path.join(ws, "lib/b/d39.so"), os.path.join(ws, "lib/b/d40.so")))
PY
stop_daemon
start_daemon

step "files two images share in different layers are fetched once"
# Another image, of one layer of its own: two of the first image's files
# under other names, beside a file of its own in a directory of its own (a
# read brings along only files of its directory). eStargz in the same
# chunks cuts a file into the same pieces whatever layer holds it.
mkdir -p "$t/other/opt" "$t/other/own"
cp "$t/want/rootfs/bin/big" "$t/other/opt/big"
cp "$t/want/rootfs/lib/a/m7.py" "$t/other/opt/m7.py"
head -c 50000 /dev/urandom >"$t/other/own/file"
"$here/estargz.py" "$t/other" "$t/es-other" v1 --chunk 1000000
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/es-other:v1" "docker://$reg/lazy/other:v1"
"$layerfs" pull "$reg/lazy/other:v1" --insecure-registry "$reg" --on-read >/dev/null
other_layer=$("$layerfs" image ls --json | python3 -c "
import json, sys
print(next(i for i in json.load(sys.stdin) if i['reference'].endswith('/lazy/other:v1'))['layers'][-1])")
"$layerfs" image ls --json | python3 -c "
import json, sys
first = next(i for i in json.load(sys.stdin) if i['reference'].endswith('/lazy/es:v1'))
assert '$other_layer' not in first['layers'], 'the two images share the layer'" || fail "the second image's layer is the first's"
"$layerfs" create w-other --from "$reg/lazy/other:v1" >/dev/null
mkdir "$t/w-other"
"$layerfs" mount w-other "$t/w-other" --$door >/dev/null
before=$(sent)
cmp "$t/w-other/opt/big" "$t/want/rootfs/bin/big" || fail "opt/big of the second image reads wrong"
cmp "$t/w-other/opt/m7.py" "$t/want/rootfs/lib/a/m7.py" || fail "opt/m7.py of the second image reads wrong"
shared=$(($(sent) - before))
echo "   6 MB the first image fetched, read in another image's layer: $shared bytes sent"
((shared == 0)) || fail "files the first image fetched were fetched again: $shared bytes"
cmp "$t/w-other/own/file" "$t/other/own/file" || fail "the second image's own file reads wrong"
(($(sent) > before)) || fail "the second image's own file was not fetched"

step "a user's daemon pulls lazily: files whose mode lets no one write are filled, their modes kept"
# Such a daemon owns its layers' files but is not let past their modes:
# it lends itself write permission for the moment it writes a piece.
as_user() {
	setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$t/user" \
		XDG_RUNTIME_DIR="$t/user/run" LAYERFS_STORE="$t/user/store" "$@"
}
if ! command -v fusermount3 >/dev/null || ! as_user sh -c ': <>/dev/fuse' 2>/dev/null; then
	skip_or_fail "lazy pulls by a user's daemon" "needs fusermount3, and /dev/fuse open to users"
else
	mkdir -p "$t/user/run" "$t/user/mnt"
	chmod 700 "$t/user/run"
	chmod 711 "$t"
	cp "$here/tree.py" "$t/user/"
	chown -R 65534:65534 "$t/user"
	coproc USER_DAEMON { exec setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$t/user" \
		XDG_RUNTIME_DIR="$t/user/run" LAYERFS_STORE="$t/user/store" "$layerfs" daemon 2>>"$t/daemon.log"; }
	user_daemon=$USER_DAEMON_PID
	pids+=("$user_daemon")
	read -r -t 30 ready <&"${USER_DAEMON[0]}" || fail "the user's daemon never said it was ready"
	as_user "$layerfs" pull "$reg/lazy/zc:v1" --insecure-registry "$reg" --on-read >/dev/null ||
		fail "the user's lazy pull"
	as_user "$layerfs" create w-user --from "$reg/lazy/zc:v1" >/dev/null
	as_user "$layerfs" mount w-user "$t/user/mnt" >/dev/null || fail "the user's mount"
	# The user's workspace shows its files as the user's own.
	as_user "$t/user/tree.py" "$t/user/mnt" | sed -E 's/ [0-9]+:[0-9]+ / /' >"$t/user.got" ||
		fail "reading the user's workspace"
	sed -E 's/ [0-9]+:[0-9]+ / /' "$t/zstd.want" | diff -u - "$t/user.got" ||
		fail "the user's lazy workspace differs from umoci's unpack"
	as_user "$layerfs" image ls | grep -q "^$reg/lazy/zc:v1 .* 100%$" ||
		fail "the user's image is not whole after reading everything: $(as_user "$layerfs" image ls)"
	kill -TERM "$user_daemon"
	wait "$user_daemon" || fail "the user's daemon did not stop cleanly"
	echo "   read-only files filled by a user's daemon: its tree equals umoci's unpack"
fi

fi

step "a corrupted piece fails its read with EIO, is logged, and is not kept"
# Files of its own, so its pieces are no other image's.
mkdir -p "$t/own/b" "$t/own/c"
for i in $(seq 40); do head -c $((i * 1000)) /dev/urandom >"$t/own/b/d$i.so"; done
# In a directory of its own: no read in b/ brings it along.
head -c 30000 /dev/urandom >"$t/own/c/late.so"
"$here/estargz.py" "$t/own" "$t/es-bad" v1 --chunk 1000000
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/es-bad:v1" "docker://$reg/lazy/bad:v1"
bad_blob=$(python3 -c "
import json, glob
for f in glob.glob('$t/es-bad/blobs/sha256/*'):
    try: m = json.load(open(f))
    except Exception: continue
    if isinstance(m, dict) and 'layers' in m: print(m['layers'][0]['digest'].split(':')[1])")
stored=$(find "$t/reg" -path "*/blobs/sha256/*/$bad_blob/data")
offset=$(python3 - "$t/es-bad" "$bad_blob" <<'PY'
import gzip, json, sys, tarfile, io
blob = open(f"{sys.argv[1]}/blobs/sha256/{sys.argv[2]}", "rb").read()
toc_offset = int(blob[-51 + 16:-51 + 32], 16)
toc = json.loads(tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob[toc_offset:-51]))).extractfile("stargz.index.json").read())
e = next(e for e in toc["entries"] if e["name"] == "b/d20.so")
print(e["offset"] + 40)
PY
)
cp "$stored" "$t/good-blob"
printf 'X' | dd of="$stored" bs=1 seek="$offset" conv=notrunc status=none
"$layerfs" pull "$reg/lazy/bad:v1" --insecure-registry "$reg" --on-read >/dev/null
"$layerfs" create w-bad --from "$reg/lazy/bad:v1" >/dev/null
mkdir "$t/w-bad"
"$layerfs" mount w-bad "$t/w-bad" --$door >/dev/null
if err=$(cat "$t/w-bad/b/d20.so" 2>&1 >/dev/null); then fail "a corrupted piece was served"; fi
[[ $err == *"Input/output error"* ]] || fail "a corrupted piece's read said: $err"
grep -q "does not match its digest.*$reg/lazy/bad:v1" "$t/daemon.log" || grep -q "$reg/lazy/bad:v1.*does not match its digest" "$t/daemon.log" ||
	fail "no log line names the image of the corrupted piece"
grep "does not match its digest" "$t/daemon.log" | grep -q "b/d20.so" || fail "the log does not name the piece"
cmp "$t/w-bad/b/d19.so" "$t/own/b/d19.so" || fail "a sound file next to the corrupted one reads wrong"
cp "$t/good-blob" "$stored"
cmp "$t/w-bad/b/d20.so" "$t/own/b/d20.so" || fail "the mended piece reads wrong"

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

step "a registry gone: a read fails after LAYERFS_LAZY_WAIT, and works once it is back"
stop_proxy
fails_after_waiting "$t/w-bad/c/late.so" "the registry gone" "$reg/lazy/bad:v1"
start_proxy
cmp "$t/w-bad/c/late.so" "$t/own/c/late.so" || fail "the read after the registry came back"

if [[ $door == fuse ]]; then
step "a daemon killed -9 during completion resumes it, fetching again at most the batch in flight"
# Completion asks 8 MiB of the blob at a time (BATCH in the daemon's
# lazy.rs), notes it, and asks the next: a kill loses at most the one in
# flight. A blob of five batches, at 16 MB/s, killed after 1.5 s.
stop_proxy
start_proxy --rate 16000000
batch=$((8 << 20))
# Files of its own again: every byte of it has to come from its blob.
mkdir -p "$t/own2"
for i in $(seq 20); do head -c 2000000 /dev/urandom >"$t/own2/f$i"; done
"$here/estargz.py" "$t/own2" "$t/es-slow" v1 --chunk 1000000
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/es-slow:v1" "docker://$reg/lazy/slow:v1"
"$layerfs" image rm "$reg/lazy/es:v1" >/dev/null
"$layerfs" rm --force w-es >/dev/null
"$layerfs" layer prune >/dev/null
size=$(blob_size es-slow)
before=$(sent)
"$layerfs" pull "$reg/lazy/slow:v1" --insecure-registry "$reg" >/dev/null
sleep 1.5
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
got=$(($(sent) - before))
echo "   $got of $size bytes in before the kill"
((got > batch + batch / 2 && got < size)) || fail "the kill did not land after a batch was noted ($got of $size)"
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
((total <= size + batch)) || fail "$total bytes fetched for a blob of $size: more than the batch in flight fetched again"
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
fi
echo "lazy pulls through $door: all checks passed"
