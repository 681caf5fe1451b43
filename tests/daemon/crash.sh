#!/usr/bin/env bash
# The daemon killed at any step: CYCLES times (default 50), a writer that
# fsyncs each record through a FUSE mount, and a request of each kind in
# flight (create, mount, commit, reset, diff, set --size, layer import,
# pull and push against a docker-registry on 127.0.0.1, rm, layer and
# image prune); then kill -9
# of the daemon at a random moment (of the keeper too, in one cycle in
# five), a restart, and checks: the writer met no error (but ENOTCONN,
# the mount gone, where the keeper died too) and every record it had
# fsync'd is in its file; each request succeeded or was refused only as a
# client is when its daemon dies; every layer the catalog lists is in the
# store and the store holds no other (no half layer), each hashing to its
# id (`layer check`); every image's layers are there; `ls` names exactly
# the workspaces in the store; every workspace recorded as mounted is
# mounted, and each entry in it stats and each file opens, errors raised;
# one daemon and one keeper. Prints the seed, which a run can be given
# again.
# LAYERFS_CRASH_DOOR=nfs mounts through the kernel's NFS client instead
# (tests/kernel/crash.sh runs it so in the QEMU guest), and
# LAYERFS_CRASH_DIR says where the store goes (default /tmp; it must keep
# inode numbers).
# Needs root and /dev/fuse, or an NFS client for nfs (docker-registry for
# the pull and push); says SKIPPED without them (tests/skip.sh).
# usage: tests/daemon/crash.sh LAYERFS [CYCLES] [SEED]
set -euo pipefail
layerfs=$(realpath "$1")
cycles=${2:-50}
seed=${3:-$RANDOM}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
door=${LAYERFS_CRASH_DOOR:-fuse}
if [[ $(id -u) != 0 || ($door == fuse && ! -c /dev/fuse) ]]; then
	skip_or_fail "the daemon killed at every step ($door)" "needs root, and /dev/fuse for FUSE"
	exit 0
fi
command -v python3 >/dev/null || { skip_or_fail "the daemon killed at every step" "python3 is missing"; exit 0; }
RANDOM=$seed
echo "seed $seed, $cycles cycles through $door"
make_scratch crash "${LAYERFS_CRASH_DIR:-/tmp}"
daemon= registry= writer=
cleanup() {
	[[ -n $writer ]] && kill "$writer" 2>/dev/null
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	[[ -n $registry ]] && kill "$registry" 2>/dev/null
	unmount_under "$t"
	pkill -f "layerfs keeper --store $t/" 2>/dev/null || true
	rm -rf "$t"
}
trap cleanup EXIT
fail() {
	echo "FAILED (seed $seed, cycle ${cycle:-0}): $*"
	[[ -f $t/daemon.log ]] && tail -20 "$t/daemon.log"
	exit 1
}
json() { "$layerfs" --json "$@"; }

# A registry of its own, where there is one, for pulls and pushes.
reg=
if command -v docker-registry >/dev/null; then
	source "$here/../registry/serve.sh"
	start_registry "$t/registry" || fail "the registry did not start"
	registry=$registry_pid
	reg=127.0.0.1:$registry_port
else
	skip_or_fail "the daemon killed at every step: pull and push" "docker-registry is not installed"
fi

start_daemon
mkdir -p "$t/base/etc" "$t/m" "$t/imports"
for i in $(seq 20); do echo "base $i" >"$t/base/etc/f$i"; done
base=$("$layerfs" layer import "$t/base")
"$layerfs" create steady --from "$base" >/dev/null
mkdir "$t/m/steady"
"$layerfs" mount steady "$t/m/steady" "--$door" >/dev/null
"$layerfs" create scratch --from "$base" >/dev/null
if [[ -n $reg ]]; then
	"$layerfs" push "$base" "$reg/crash/base:v1" --insecure-registry "$reg" >/dev/null 2>&1 ||
		fail "the first push to the test's registry"
fi

# The requests a cycle may have in flight, each its own process. Each is
# one the daemon grants while it lives (on a workspace of its own where it
# changes one), so each command ends in success or in the refusal a client
# sees when its daemon dies under it: nothing else.
request() {
	local c=$1 kind=$2
	case $kind in
	create) "$layerfs" create "c$c" --from "$base" ;;
	mount)
		"$layerfs" create "m$c" --from "$base" && mkdir -p "$t/m/m$c" &&
			"$layerfs" mount "m$c" "$t/m/m$c" "--$door"
		;;
	unmount)
		"$layerfs" create "u$c" --from "$base" && mkdir -p "$t/m/u$c" &&
			"$layerfs" mount "u$c" "$t/m/u$c" "--$door" && "$layerfs" unmount "u$c"
		;;
	commit) "$layerfs" commit steady --message "cycle $c" ;;
	reset) "$layerfs" reset scratch ;;
	diff) "$layerfs" diff steady ;;
	size) "$layerfs" set scratch --size "$((64 + c))M" ;;
	import)
		mkdir -p "$t/imports/$c"
		for i in $(seq 200); do echo "$c $i" >"$t/imports/$c/f$i"; done
		"$layerfs" layer import "$t/imports/$c"
		;;
	pull) "$layerfs" pull "$reg/crash/base:v1" --insecure-registry "$reg" ;;
	# scratch is never written: it has nothing uncommitted to refuse.
	push) "$layerfs" push scratch "$reg/crash/scratch:c$c" --insecure-registry "$reg" ;;
	rm) "$layerfs" create "r$c" --from "$base" && "$layerfs" rm --force "r$c" ;;
	prune) "$layerfs" layer prune ;;
	image-prune) "$layerfs" image prune ;;
	esac
}
kinds=(create mount unmount commit reset diff size import rm prune image-prune)
[[ -z $reg ]] || kinds+=(pull push)
# What a command says when the daemon it asked dies before answering, or
# is dead when it asks (workspaces.rs in layerfs-cli).
died="the layerfs daemon stopped before it answered|no layerfs daemon is running for the store"

# One writer per cycle, on a file of its own in the steady workspace:
# numbered records, each fsync'd, the count fsync'd written to a file
# outside the workspace after each fsync. Its first error ends it, named
# (errno) in $t/writer-error, with status 1; told to stop, it ends with 0.
start_writer() {
	rm -f "$t/writer-error"
	python3 - "$t/m/steady/w$1" "$t/synced" "$t/stop-writer" "$t/writer-error" <<-'PY' &
		import errno, os, sys
		path, synced, stop, error = sys.argv[1:5]
		n = 0
		try:
		    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
		    while not os.path.exists(stop) and n < 100000:
		        os.write(fd, b"record %08d\n" % n)
		        os.fsync(fd)
		        n += 1
		        with open(synced + ".new", "w") as f:
		            f.write(str(n))
		        os.rename(synced + ".new", synced)
		except OSError as e:
		    with open(error, "w") as f:
		        f.write(f"{errno.errorcode.get(e.errno, e.errno)} after {n} records: {e}")
		    sys.exit(1)
		PY
	writer=$!
}

# The checks after a restart.
check_store() {
	local c=$1
	# Every record fsync'd is in the writer's file, in order.
	local synced
	synced=$(cat "$t/synced" 2>/dev/null || echo 0)
	total_synced=$((total_synced + synced))
	python3 - "$t/m/steady/w$c" "$synced" <<-'PY' || fail "the writer's fsync'd records"
		import sys
		path, synced = sys.argv[1], int(sys.argv[2])
		data = open(path, "rb").read()
		want = b"".join(b"record %08d\n" % i for i in range(synced))
		if not data.startswith(want):
		    sys.exit(f"{path}: {synced} records fsync'd, {len(data)} bytes there, not them")
		PY
	# Layers: what the catalog lists is what the store holds, each whole.
	local listed held
	listed=$(json layer ls | python3 -c 'import json,sys; print("\n".join(sorted(l["id"] for l in json.load(sys.stdin))))') ||
		fail "layer ls after the restart"
	held=$(ls "$LAYERFS_STORE/layers" | sort)
	[[ $listed == "$held" ]] || fail "layer ls and the store's layers differ:"$'\n'"$(diff <(echo "$listed") <(echo "$held"))"
	local staged
	staged=$(ls -A "$LAYERFS_STORE/staging") || fail "the store has no staging directory"
	[[ -z $staged ]] || fail "staging holds $staged"
	# Images: every layer of each is in the store.
	json image ls | python3 -c '
import json, os, sys
for image in json.load(sys.stdin):
    for layer in image["layers"]:
        if not os.path.isdir(os.path.join(sys.argv[1], layer)):
            sys.exit("image %s lacks layer %s" % (image["reference"], layer))' "$LAYERFS_STORE/layers" ||
		fail "image ls after the restart"
	# Workspaces: ls names those in the store; a mounted one answers, and
	# every file in it opens.
	json ls >"$t/ls.json" || fail "ls after the restart"
	python3 - "$t/ls.json" "$LAYERFS_STORE/workspaces" <<-'PY' || fail "ls and the store's workspaces"
		import json, os, sys
		listed = json.load(open(sys.argv[1]))
		names = sorted(w["name"] for w in listed)
		held = sorted(os.listdir(sys.argv[2]))
		if names != held:
		    sys.exit(f"ls names {names}, the store holds {held}")
		mounts = {line.split()[1] for line in open("/proc/mounts")}
		def raise_it(e):
		    raise e
		for w in listed:
		    m = w.get("mount")
		    if not m:
		        continue
		    if m["path"] not in mounts:
		        sys.exit(f"{w['name']} is recorded mounted on {m['path']}, which is no mount")
		    # Every error raised: a dead mount fails here, not quietly.
		    seen = 0
		    for dirpath, dirs, files in os.walk(m["path"], onerror=raise_it):
		        for name in dirs + files:
		            os.lstat(os.path.join(dirpath, name))
		        for name in files:
		            with open(os.path.join(dirpath, name), "rb") as f:
		                f.read(1)
		            seen += 1
		    if seen == 0:
		        sys.exit(f"{w['name']}, mounted on {m['path']}, shows no file")
		PY
	# Every layer's files still hash to its id.
	"$layerfs" layer check >"$t/check.out" || fail "layer check after the restart: $(grep -v ' sound$' "$t/check.out")"
	local daemons=0 keepers pid
	# This store's daemons: those started with it in their environment.
	for pid in $(pgrep -f "^$layerfs daemon" || true); do
		tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "LAYERFS_STORE=$t/store" && daemons=$((daemons + 1))
	done
	keepers=$(pgrep -fc "layerfs keeper --store $t/" || true)
	[[ $daemons == 1 && $keepers == 1 ]] || fail "$daemons daemons and $keepers keepers after the restart: $(pgrep -fa "layerfs (daemon|keeper)")"
}

killed_keeper=0 total_synced=0 answered=0 cut=0
for cycle in $(seq "$cycles"); do
	rm -f "$t/stop-writer" "$t/synced"
	mounted=$(json ls | python3 -c 'import json,sys; print(any(w["name"] == "steady" and w.get("mount") for w in json.load(sys.stdin)))')
	[[ $mounted == True ]] || fail "steady is not mounted at the start of the cycle"
	start_writer "$cycle"
	# Writes in flight at the kill: the writer has made one durable first
	# (a python3 start takes seconds in a TCG guest).
	for _ in $(seq 600); do [[ -s $t/synced ]] && break; sleep 0.05; done
	[[ -s $t/synced ]] || fail "the writer fsync'd nothing in 30 s"
	# Three kinds, none twice: two of one kind may refuse each other.
	pids=() asked=()
	for kind in $(printf '%s\n' "${kinds[@]}" | shuf --random-source=<(yes "$seed.$cycle")); do
		((${#asked[@]} < 3)) || break
		request "$cycle" "$kind" >/dev/null 2>"$t/request-$kind.err" &
		pids+=($!) asked+=("$kind")
	done
	# Most requests take milliseconds: the kill comes within 0.3 s, and in
	# one cycle in three within 30 ms, often before they are answered.
	sleep "0.$(printf %03d $((RANDOM % (cycle % 3 ? 300 : 30))))"
	keeper_killed=false
	if ((RANDOM % 5 == 0)); then
		pkill -9 -f "layerfs keeper --store $t/" || true
		killed_keeper=$((killed_keeper + 1)) keeper_killed=true
	fi
	kill -9 "$daemon"
	wait "$daemon" 2>/dev/null || true
	for i in "${!pids[@]}"; do
		if wait "${pids[i]}"; then
			answered=$((answered + 1))
			continue
		fi
		err=$(cat "$t/request-${asked[i]}.err")
		[[ $err =~ $died ]] || fail "the ${asked[i]} request failed otherwise than by the daemon's death: $err"
		cut=$((cut + 1))
	done
	start_daemon
	touch "$t/stop-writer"
	if ! wait "$writer"; then
		# A mount whose keeper died too is gone: its writes fail so, and
		# only so (ECONNABORTED for one in flight as the connection went,
		# ENOTCONN after); any other error is the daemon's.
		error=$(cat "$t/writer-error")
		[[ $keeper_killed == true && $error =~ ^(ENOTCONN|ECONNABORTED) ]] ||
			fail "the writer (the keeper killed: $keeper_killed): $error"
	fi
	writer=
	check_store "$cycle"
	# The next cycle's writer needs its workspace mounted: after a keeper's
	# death the restarted daemon mounts it again.
	for _ in $(seq 100); do [[ -d $t/m/steady/etc ]] && break; sleep 0.1; done
	rm -f "$t/m/steady/w$cycle"
done
((total_synced > 0)) || fail "the writers fsync'd nothing before the kills: nothing was checked"
((answered > 0)) || fail "no request was answered in $cycles cycles: every one refused, none checked"
# The digest check can fail: a file of a layer changed behind the store's back.
echo changed >>"$LAYERFS_STORE/layers/$base/etc/f1"
if out=$("$layerfs" layer check 2>&1); then fail "layer check passed a changed layer: $out"; fi
[[ $out == *"$base DIFFERS"* ]] || fail "layer check of a changed layer said: $out"
echo "$cycles cycles (the keeper killed too in $killed_keeper), $total_synced records fsync'd before the kills:"
echo "every one there; store, catalog and mounts agreeing; $answered requests done, $cut cut off by the kill"
