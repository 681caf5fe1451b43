#!/usr/bin/env bash
# The daemon as a newcomer and a user meet it, through FUSE: `layerfs demo`
# (a mounted workspace over two generated layers; Ctrl-C removes it all,
# also with no reader left on its output), and a user who is not root,
# whose daemon of their own mounts through fusermount3 (nosuid, nodev),
# serves eighty mounts with pipes grown to their READs, refuses a device
# in an import, and is killed under a writer and files held open, which
# carry on with the next daemon.
# Needs root (to act as the user) and /dev/fuse; says SKIPPED without them
# (tests/skip.sh).
# usage: tests/daemon/user.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../fusectl.sh"
source "$(dirname "$0")/lib.sh"
daemon_scratch "the demo and a user's daemon through FUSE"
mkdir -p "$t/base/etc" "$t/w"
echo base >"$t/base/etc/name"
devices_tarball

step "layerfs demo: a mounted workspace over two generated layers; Ctrl-C removes it all"
# interrupt_demo WHICH: Ctrl-C ends the demo with status 0, leaving no mount
# and no store.
interrupt_demo() {
	local rc=0
	kill -INT "$demo"
	wait "$demo" || rc=$?
	[[ $rc == 0 ]] || fail "$1: exit status $rc after Ctrl-C"
	mounted "$t/w" && fail "$1 left its mount"
	[[ -e /tmp/layerfs-demo-$demo ]] && fail "$1 left its store"
	return 0
}
coproc DEMO { exec "$layerfs" demo "$t/w" 2>>"$t/daemon.log"; }
demo=$DEMO_PID
diff_line=
while read -r -t 30 line <&"${DEMO[0]}"; do
	[[ $line == *" diff demo" ]] && diff_line=$line
	[[ $line == Ctrl-C* ]] && break
done
[[ ${line:-} == Ctrl-C* ]] || fail "the demo never said how to stop it"
mounted "$t/w" || fail "the demo's workspace is not mounted"
# Its commands run as printed, from a shell with no layerfs on PATH.
[[ -n $diff_line ]] || fail "the demo printed no diff command"
echo mine >"$t/w/notes.txt"
[[ $(env PATH=/usr/bin:/bin bash -c "$diff_line") == "A /notes.txt" ]] ||
	fail "the demo's own command '$diff_line' did not run as printed"
[[ $("$t/w/bin/hello") == "hello from the tools layer" ]] || fail "bin/hello"
[[ -e $t/w/docs/old-notes.txt ]] && fail "the demo's whiteout hides nothing"
interrupt_demo "the demo"
# Its cleanup does not hang on stdout: with no reader left on its pipe
# (`layerfs demo | tee`, the tee gone first), Ctrl-C still removes it all.
coproc DEMO { exec "$layerfs" demo "$t/w" 2>>"$t/daemon.log"; }
demo=$DEMO_PID
exec {DEMO[0]}<&-
for _ in $(seq 200); do mounted "$t/w" && break; sleep 0.05; done
mounted "$t/w" || fail "the demo with no reader of its stdout did not mount"
sleep 0.5
kill -0 "$demo" 2>/dev/null || fail "the demo with no reader of its stdout ended by itself"
interrupt_demo "the demo with no reader of its stdout"

step "a user who is not root runs a daemon of their own and mounts through fusermount3"
nobody() { setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$t/nobody" \
	XDG_RUNTIME_DIR="$t/nobody/run" LAYERFS_STORE="$t/nobody/store" "$@"; }
# start_nobody_daemon WHEN: the user's daemon, once it says it is ready.
start_nobody_daemon() {
	coproc NOBODY { exec setpriv --reuid 65534 --regid 65534 --clear-groups env HOME="$t/nobody" \
		XDG_RUNTIME_DIR="$t/nobody/run" LAYERFS_STORE="$t/nobody/store" "$layerfs" daemon 2>>"$t/daemon.log"; }
	read -r -t 30 ready <&"${NOBODY[0]}" || fail "the user's daemon never said it was ready$1"
}
if ! command -v fusermount3 >/dev/null; then
	skip_or_fail "the daemon through FUSE: a user who is not root" "fusermount3 is not installed (apt-get install fuse3)"
elif ! nobody sh -c ': <>/dev/fuse' 2>/dev/null; then
	skip_or_fail "the daemon through FUSE: a user who is not root" "/dev/fuse is not open to users who are not root here (Debian makes it 0666; verify.sh opens it for its run)"
else
	mkdir -p "$t/nobody/run" "$t/nobody/mnt"
	chmod 755 "$t"
	chmod 700 "$t/nobody/run"
	chown -R 65534:65534 "$t/nobody"
	start_nobody_daemon ""
	layer=$(nobody "$layerfs" layer import "$t/base")
	nobody "$layerfs" create mine --from "$layer" >/dev/null
	nobody "$layerfs" mount mine "$t/nobody/mnt" >/dev/null || fail "a user's FUSE mount"
	grep -q "^mine .*(fuse)" <<<"$(nobody "$layerfs" ls)" || fail "the default door for a user is not FUSE"
	[[ $(nobody cat "$t/nobody/mnt/etc/name") == base ]] || fail "reading as the user"
	opts=$(awk -v m="$t/nobody/mnt" '$2 == m {print $4}' /proc/mounts)
	[[ ,$opts, == *,nosuid,* && ,$opts, == *,nodev,* ]] || fail "the user's mount is '$opts', not nosuid,nodev"
	# A user's pipes count against pipe-user-pages-soft (16,384 pages by
	# default). Each mount's thread splices READs through a pipe of its
	# own, grown only as far as its READs need, so eighty mounts read
	# cold still get pipes that hold their READs, not two-buffer ones.
	mkdir -p "$t/nobody/wide"
	head -c $((1 << 20)) /dev/urandom >"$t/nobody/wide/big"
	chown -R 65534:65534 "$t/nobody/wide"
	wide=$(nobody "$layerfs" layer import "$t/nobody/wide")
	for i in $(seq 80); do
		nobody "$layerfs" create "wide$i" --from "$wide" >/dev/null
		nobody mkdir "$t/nobody/wide$i"
		nobody "$layerfs" mount "wide$i" "$t/nobody/wide$i" >/dev/null || fail "the user's mount $i of 80"
		nobody cmp -s "$t/nobody/wide$i/big" "$t/nobody/wide/big" || fail "reading the user's mount $i of 80"
	done
	pipes=$(python3 - "$NOBODY_PID" <<'EOF'
import os, sys, fcntl
F_GETPIPE_SZ = 1032
sizes = {}
for fd in os.listdir(f"/proc/{sys.argv[1]}/fd"):
    path = f"/proc/{sys.argv[1]}/fd/{fd}"
    try:
        if os.readlink(path).startswith("pipe:"):
            held = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            sizes[os.fstat(held).st_ino] = fcntl.fcntl(held, F_GETPIPE_SZ)
            os.close(held)
    except OSError:
        pass
grown = sum(1 for s in sizes.values() if s > 65536)
small = sum(1 for s in sizes.values() if s < 65536)
print(grown, small, sorted(set(sizes.values())))
EOF
)
	read -r grown small _ <<<"$pipes"
	echo "   80 mounts of a user read cold: $grown pipes grown, $small smaller than the default (sizes ${pipes#* * })"
	[[ $grown -ge 80 && $small == 0 ]] || fail "a user's 80 mounts: $grown pipes grown, $small smaller than the default"
	for i in $(seq 80); do nobody "$layerfs" rm --force "wide$i" >/dev/null; done
	# The same tarball of devices, imported by the user: the device cannot be
	# made, and the refusal names it; a FIFO alone imports.
	cp "$t/devices.tar" "$t/nobody/devices.tar"
	tar -C "$t/devices" -cf "$t/nobody/fifo.tar" ./pipe
	chown 65534:65534 "$t/nobody/devices.tar" "$t/nobody/fifo.tar"
	if err=$(nobody "$layerfs" layer import "$t/nobody/devices.tar" 2>&1); then
		fail "a user imported a device"
	fi
	[[ $err == *'"./null"'*root* && $(wc -l <<<"$err") == 1 ]] || fail "the user's device import said: $err"
	mkdir "$t/nobody/dev"
	chown 65534:65534 "$t/nobody/dev"
	fifo=$(nobody "$layerfs" layer import "$t/nobody/fifo.tar")
	nobody "$layerfs" create dev --from "$fifo" >/dev/null
	nobody "$layerfs" mount dev "$t/nobody/dev" >/dev/null || fail "the user's mount of the FIFO layer"
	# (Only the user reaches their mount: no allow_other.)
	nobody test -p "$t/nobody/dev/pipe" || fail "the user's FIFO is not a FIFO"
	nobody sh -c "echo mine >'$t/nobody/mnt/new'" || fail "writing as the user"
	nobody "$layerfs" commit mine >/dev/null || fail "a user's commit"
	# Without passthrough every write is a request to the daemon: killed
	# under them, it leaves requests it had read and not answered, which
	# the next daemon is sent again. The writer goes on until told to stop
	# (at most 60 s), so the kill falls while it writes however fast the
	# door is; it says how many lines it wrote, or which call failed.
	fuse_errors start
	nobody python3 -c '
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
end, i = time.monotonic() + 60, 0
while not (i % 100 == 0 and (os.path.exists(sys.argv[2]) or time.monotonic() > end)):
    try:
        os.write(fd, b"%08d\n" % i)
        i += 1
        if i % 500 == 0:
            os.fsync(fd)
    except OSError as e:
        sys.exit("line %d: %s" % (i, e))
os.close(fd)
print(i)
' "$t/nobody/mnt/appended" "$t/nobody/stop" >"$t/nobody/appended.lines" 2>"$t/nobody/appended.err" &
	appender=$!
	for _ in $(seq 100); do [[ $(nobody stat -c %s "$t/nobody/mnt/appended" 2>/dev/null || echo 0) -gt 9000 ]] && break; sleep 0.02; done
	kill -0 "$appender" 2>/dev/null || fail "the user's writer ended before the kill: $(cat "$t/nobody/appended.err")"
	hold "$t/nobody/mnt" new nobody
	kill -9 "$NOBODY_PID"
	wait "$NOBODY_PID" 2>/dev/null || true
	start_nobody_daemon " again"
	held_go "the user's daemon's kill -9 and restart"
	sleep 0.2
	touch "$t/nobody/stop"
	if ! wait "$appender"; then
		fuse_errors show
		fail "the user's writer got an error across the kill and restart: $(cat "$t/nobody/appended.err")"
	fi
	fuse_errors stop
	lines=$(cat "$t/nobody/appended.lines")
	((lines > 1000)) || fail "the user's writer wrote only $lines lines"
	nobody cat "$t/nobody/mnt/appended" | cmp - <(python3 -c '
import sys
for i in range(int(sys.argv[1])):
    sys.stdout.write("%08d\n" % i)
' "$lines") || fail "the user's file written across the kill differs from the $lines lines written"
	kill -TERM "$NOBODY_PID"
	wait "$NOBODY_PID" || fail "the user's daemon's exit status after SIGTERM"
	mounted "$t/nobody/mnt" && fail "the user's mount is left after SIGTERM"
fi
echo "PASSED: the demo and a user's daemon through FUSE"

