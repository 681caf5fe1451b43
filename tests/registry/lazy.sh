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
# Then: a held file that loses its name reads its data; a file two images'
# different layers hold, read in one, is not fetched for the other; a
# user's daemon pulls lazily and fills files whose mode lets no one write;
# a byte corrupted in the registry's copy of the blob fails that read with
# EIO and a log line naming image, layer and piece, and nothing of it is
# kept; a registry gone fails a read after LAYERFS_LAZY_WAIT and the next
# read after it is back works. Completion across a kill, pushes of lazy
# images and tokens that run out are tests/registry/lazy-lifecycle.sh.
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
source "$here/lazy-lib.sh"
lazy_scratch "lazy pulls"

step "one tree in three forms: gzip (umoci), zstd:chunked (skopeo), eStargz (estargz.py)"
three_forms
start_daemon

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
step "eStargz with small files packed into shared members (innerOffset), lazily through $door"
"$here/estargz.py" "$t/want/rootfs" "$t/es-pack" v1 --chunk 1000000 --pack 65536
skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$t/es-pack:v1" "docker://$reg/lazy/es-pack:v1"
packed=$(python3 - "$t/es-pack" <<'PY'
import glob, gzip, io, json, sys, tarfile
for f in glob.glob(f"{sys.argv[1]}/blobs/sha256/*"):
    blob = open(f, "rb").read()
    if blob[-51 + 32:-51 + 38] == b"STARGZ":
        at = int(blob[-51 + 16:-51 + 32], 16)
        toc = tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob[at:-51]))).extractfile("stargz.index.json")
        print(sum(1 for e in json.load(toc)["entries"] if e.get("innerOffset")))
PY
)
echo "   $packed files found by an innerOffset"
((packed > 10)) || fail "the packed image has $packed files found by an innerOffset"
out=$("$layerfs" pull "$reg/lazy/es-pack:v1" --insecure-registry "$reg" --on-read 2>&1)
[[ $out == *"lazy: 0 of"* ]] || fail "the packed image was not pulled lazily: $out"
"$layerfs" create w-pack --from "$reg/lazy/es-pack:v1" >/dev/null
mkdir "$t/w-pack"
"$layerfs" mount w-pack "$t/w-pack" --$door >/dev/null
"$here/tree.py" "$t/w-pack" >"$t/pack.got"
diff -u "$t/estargz.want" "$t/pack.got" || fail "the packed image's workspace differs from umoci's unpack"
"$layerfs" rm --force w-pack >/dev/null
"$layerfs" image rm "$reg/lazy/es-pack:v1" >/dev/null
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

step "a registry gone: a read fails after LAYERFS_LAZY_WAIT, and works once it is back"
stop_proxy
fails_after_waiting "$t/w-bad/c/late.so" "the registry gone" "$reg/lazy/bad:v1"
start_proxy
cmp "$t/w-bad/c/late.so" "$t/own/c/late.so" || fail "the read after the registry came back"
echo "lazy pulls through $door: all checks passed"
