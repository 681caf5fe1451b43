#!/usr/bin/env bash
# Pulls when the registry or the disk fails them, against a real registry
# (Debian's docker-registry on 127.0.0.1): through a relay that slows the
# registry down, `ls`, `create` and `mount` answer while a pull runs; a
# registry gone mid-layer and a daemon killed -9 mid-pull leave no layer,
# and the next pull finishes. A store on a 20 MiB tmpfs fills during a
# pull: one line, no half layer, and the daemon pulls a smaller image next.
# Over HTTPS, a registry whose certificate a CA of the test's own signed is
# refused until the daemon is given the CA (LAYERFS_REGISTRY_CA).
# Needs root, /dev/fuse, docker-registry, umoci, skopeo, htpasswd and openssl; says
# SKIPPED without them (tests/skip.sh).
# usage: tests/registry/outages.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/image.sh"
registry_scratch "pulls when the registry or the disk fails"
two_layer_image
start_daemon
"$layerfs" pull "$plain/test/img:v1" --insecure-registry "$plain" >/dev/null
htpasswd -Bbn tester s3cret >"$t/htpasswd"

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
echo "pulls when the registry or the disk fails: ok"

