#!/usr/bin/env bash
# The daemon as a service: the systemd units in contrib/ pass
# `systemd-analyze verify` with nothing to say, and the launchd plist
# parses; the daemon does what the units rely on, with a socket of the
# test's own as systemd's NOTIFY_SOCKET: READY=1 with its pid once it
# answers; SIGUSR1 (the units' ExecReload) has it leave its FUSE mount and
# a file held open in it to the keeper and exit 0 after STOPPING=1; the next
# daemon (what Restart= starts) says READY=1 and serves both on (a write
# made between the two waits for the next: it is the daemon's to answer;
# a request made at each READY=1 is answered); SIGTERM
# (a stop) says STOPPING=1, unmounts, and exits 0.
# Needs root, /dev/fuse and python3 (systemd-analyze for the units); says
# SKIPPED without them (tests/skip.sh).
# usage: tests/daemon/service.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/../lib.sh"
source "$here/../fusectl.sh"
t=$(mktemp -d /tmp/layerfs-service.XXXXXX)
daemon= listener= holder=
cleanup() {
	[[ -n $holder ]] && kill "$holder" 2>/dev/null
	[[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	[[ -n $listener ]] && kill "$listener" 2>/dev/null
	unmount_under "$t"
	pkill -f "layerfs keeper --store $t/" 2>/dev/null || true
	rm -rf "$t"
}
trap cleanup EXIT

step "the units pass systemd-analyze verify; the plist parses"
if command -v systemd-analyze >/dev/null; then
	for unit in user system; do
		# The unit as installed, with the binary where this run built it.
		sed -e "s|%h/.cargo/bin/layerfs|$layerfs|" -e "s|/usr/local/bin/layerfs|$layerfs|" \
			"$repo/contrib/systemd/$unit/layerfs.service" >"$t/layerfs.service"
		said=$(systemd-analyze verify --man=no "$t/layerfs.service" 2>&1) || fail "the $unit unit: $said"
		[[ -z $said ]] || fail "systemd-analyze has something to say of the $unit unit: $said"
	done
	# And the check can fail: a unit with a wrong key is reported.
	printf '[Service]\nType=notfy\nExecStart=%s daemon\n' "$layerfs" >"$t/bad.service"
	[[ $(systemd-analyze verify --man=no "$t/bad.service" 2>&1) == *notfy* ]] ||
		fail "systemd-analyze did not report a wrong unit's service type"
else
	skip_or_fail "the systemd units" "systemd-analyze is not installed (apt-get install systemd)"
fi
python3 -c 'import plistlib, sys; plistlib.load(open(sys.argv[1], "rb"))' "$repo/contrib/launchd/dev.layerfs.daemon.plist" ||
	fail "the launchd plist does not parse"

if [[ ! -c /dev/fuse || $(id -u) != 0 ]] || ! command -v python3 >/dev/null; then
	skip_or_fail "the daemon as a service" "needs root, /dev/fuse and python3"
	exit 0
fi
export LAYERFS_STORE=$t/store XDG_RUNTIME_DIR=$t/run NOTIFY_SOCKET=$t/notify
mkdir -m 700 "$t/run"

# What systemd would be told, one message per line (newlines as '|'). On
# each READY=1, before anything else, a request to the daemon that said
# it: its answer (or refusal) is noted in $t/ready-answered.
python3 - "$NOTIFY_SOCKET" "$t/told" "$layerfs" "$t/ready-answered" <<-'PY' &
	import socket, subprocess, sys
	s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
	s.bind(sys.argv[1])
	open(sys.argv[2], "w").close()
	while True:
	    message = s.recv(4096).decode()
	    if "READY=1" in message.split("\n"):
	        asked = subprocess.run([sys.argv[3], "ls"], capture_output=True, text=True)
	        with open(sys.argv[4], "a") as f:
	            f.write("answered\n" if asked.returncode == 0 else f"refused: {asked.stderr.strip()}\n")
	    with open(sys.argv[2], "a") as f:
	        f.write(message.strip("\n").replace("\n", "|") + "\n")
	PY
listener=$!
for _ in $(seq 100); do [[ -e $t/told ]] && break; sleep 0.05; done
# told N PATTERN: the Nth message matches PATTERN (waiting up to 10 s).
told() {
	for _ in $(seq 200); do
		[[ $(sed -n "$1p" "$t/told") == $2 ]] && return
		sleep 0.05
	done
	fail "message $1 to the service manager: '$(sed -n "$1p" "$t/told")', not $2 (all: $(cat "$t/told"))"
}
start_daemon() {
	"$layerfs" daemon >>"$t/daemon.out" 2>>"$t/daemon.log" &
	daemon=$!
}

# ready_answered N: the request made at the Nth READY=1 was answered.
ready_answered() {
	[[ $(sed -n "$1p" "$t/ready-answered") == answered ]] ||
		fail "a request made at READY=1 (number $1): $(sed -n "$1p" "$t/ready-answered")"
}

step "READY=1 with the daemon's pid once it answers"
start_daemon
told 1 "READY=1|MAINPID=$daemon|STATUS=serving the store *"
ready_answered 1

step "SIGUSR1: the mount and a file held in it are left to the keeper; the next daemon serves them"
mkdir -p "$t/base/etc" "$t/w"
echo base >"$t/base/etc/name"
base=$("$layerfs" layer import "$t/base")
"$layerfs" create w --from "$base" --mount "$t/w" --fuse >/dev/null
# Setgid: a file the door never passes through, so its writes are requests
# to the daemon. The holder says when it holds the file (one write done),
# writes once more when told (while no daemon serves), then once more.
chmod 2644 "$t/w/etc/name"
python3 - "$t/w/etc/name" "$t/held" "$t/write" "$t/go" <<-'PY' &
	import os, sys, time
	path, held, write, go = sys.argv[1:5]
	def wait_for(flag):
	    while not os.path.exists(flag):
	        time.sleep(0.02)
	fd = os.open(path, os.O_RDWR | os.O_APPEND)
	os.write(fd, b"before\n")
	open(held, "w").close()
	wait_for(write)
	os.write(fd, b"during\n")
	wait_for(go)
	os.write(fd, b"after\n")
	os.close(fd)
	PY
holder=$!
for _ in $(seq 200); do [[ -e $t/held ]] && break; sleep 0.05; done
[[ -e $t/held ]] || fail "the file was not held"
kill -USR1 "$daemon"
rc=0
wait "$daemon" || rc=$?
[[ $rc == 0 ]] || fail "the daemon's exit status after SIGUSR1: $rc"
told 2 "STOPPING=1|STATUS=handing over*"
awk -v m="$t/w" '$2 == m {f=1} END {exit !f}' /proc/mounts || fail "the mount went with the daemon"
# The write made while no daemon serves waits in the kernel: it is a
# request to the daemon (its connection's count of requests waiting).
touch "$t/write"
waiting=none
for _ in $(seq 100); do
	waiting=$(fuse_waiting "$t/w")
	[[ $waiting =~ ^[1-9] ]] && break
	sleep 0.05
done
[[ $waiting =~ ^[1-9] ]] || fail "the held file's write does not wait for a daemon (waiting: $waiting): it never reaches one"
first=$daemon
start_daemon
told 3 "READY=1|MAINPID=$daemon|*"
ready_answered 2
[[ $daemon != "$first" ]] || fail "the same process"
touch "$t/go"
wait "$holder" || fail "the file held across the hand-over"
holder=
[[ $(cat "$t/w/etc/name") == $'base\nbefore\nduring\nafter' ]] || fail "etc/name holds: $(cat "$t/w/etc/name")"
grep -q "FUSE session taken over" "$t/daemon.log" || fail "the next daemon mounted afresh"

step "SIGTERM: STOPPING=1, every workspace unmounted, exit 0"
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=
[[ $rc == 0 ]] || fail "the daemon's exit status after SIGTERM: $rc"
told 4 "STOPPING=1|STATUS=unmounting every workspace"
awk -v m="$t/w" '$2 == m {f=1} END {exit !f}' /proc/mounts && fail "the mount is left after SIGTERM"
echo "PASSED: the daemon as a service"
