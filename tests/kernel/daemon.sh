#!/usr/bin/env bash
# The workspace daemon through the Linux kernel NFS client, run in the QEMU
# guest by tools/kernel-client/run --no-mount with the daemon as its server
# (`layerfs daemon --store /run/lfs-store --nfs-port $NFS_PORT`):
# import, create, mount over NFS, change, commit, a second workspace from
# the commit; a size limit (ENOSPC through the client, room after a
# removal); a file removed while open (the client's .nfs name) is in no
# layer; then kill -9 of the daemon under a writer and a restart: the
# writer finishes, its checksum matches, no ESTALE; SIGTERM leaves no mount.
set -euo pipefail
# The guest runs a copy of this file; the repository is the working directory.
source "$PWD/tests/lib.sh"
source "$PWD/tests/daemon/lib.sh"
layerfs=${LAYERFS:-$PWD/target/release/layerfs}
export LAYERFS_STORE=/run/lfs-store
t=/run/lfs-daemon-test
w=$MNT w2=$t/w2
nfs_mounted() { awk -v m="$1" '$2 == m && $3 == "nfs" {f=1} END {exit !f}' /proc/mounts; }
mkdir -p "$w2"
for _ in $(seq 100); do "$layerfs" ls >/dev/null 2>&1 && break; sleep 0.1; done

step "import a directory and an OCI tarball; create; mount over NFS"
base_layers
"$layerfs" create w --from "$base" --from "$top"
"$layerfs" mount w "$w" --nfs
nfs_mounted "$w" || fail "w is not an NFS mount: $(grep " $w " /proc/mounts)"
opts=$(awk -v m="$w" '$2 == m {print $4}' /proc/mounts)
[[ ,$opts, == *,nosuid,* && ,$opts, == *,nodev,* ]] || fail "w is mounted '$opts', not nosuid,nodev"
check "$w/etc/name" top
[[ -e $w/etc/doomed ]] && fail "the whiteout does not hide etc/doomed"
echo changed >"$w/etc/name"
echo new >"$w/new"

step "commit; a second workspace from it sees the changes"
"$layerfs" commit w --message "over NFS" >/dev/null
check "$w/etc/name" changed
"$layerfs" create w2 --from w
"$layerfs" mount w2 "$w2" --nfs
check "$w2/etc/name" changed
check "$w2/new" new

step "reset while mounted over NFS: the same mount shows the layers' contents"
cat "$w/etc/name" >/dev/null
echo rewritten >"$w/etc/name"
echo made >"$w/made"
rm "$w/new"
echo deep >"$w/etc/made"
check "$w/etc/name" rewritten
ls "$w" "$w/etc" >/dev/null
stat "$w/made" "$w/etc/made" >/dev/null
"$layerfs" reset w >/dev/null
# Names the client looked up a moment ago: without a listing or an open,
# a bare stat trusts the cached entry until the directory's attribute
# cache expires (30 s), unless the daemon made the client look again.
for gone in "$w/made" "$w/etc/made"; do
	[[ -e $gone ]] && fail "stat right after the reset still finds $gone"
done
listing=$(ls "$w" | tr '\n' ' ')
[[ $listing == "etc new " ]] || fail "ls after the reset: '$listing'"
check "$w/etc/name" changed
check "$w/new" new
changes=$("$layerfs" diff w) || fail "diff w after the reset"
[[ -z $changes ]] || fail "changes left after the reset: $changes"

step "a size limit over NFS: a write past it gets ENOSPC (NFS3ERR_NOSPC), a removal makes room"
"$layerfs" set w2 --size 4M >/dev/null
if err=$(dd if=/dev/zero of="$w2/big" bs=1M count=8 conv=fsync 2>&1); then
	fail "8 MiB written into a 4 MiB workspace"
fi
[[ $err == *"No space left on device"* ]] || fail "dd past the limit: $err"
rm "$w2/big"
dd if=/dev/zero of="$w2/small" bs=1M count=2 conv=fsync status=none || fail "a 2 MiB write after the removal"
rm "$w2/small"
"$layerfs" set w2 --size none >/dev/null

step "a file removed while open is left out of a commit, the client's .nfs name with it"
exec 7<>"$w/open-removed"
echo "still open" >&7
rm "$w/open-removed"
debris=$(cd "$w" && ls -A | grep '^\.nfs' || true)
[[ -n $debris ]] || fail "the client kept no .nfs name for the open file"
changes=$("$layerfs" diff w) || fail "diff w with a removed file open"
grep -q '\.nfs' <<<"$changes" && fail "layerfs diff shows the client's file: $changes"
moment=$("$layerfs" commit w --message "while a removed file is open" --json |
	sed -n 's/.*"id": *"\([^"]*\)".*/\1/p')
[[ -d $LAYERFS_STORE/layers/$moment ]] || fail "no layer $moment"
# The layer in the store, and as w's own stack holds it (its tree before the new upper).
own=$(ls -d "$LAYERFS_STORE/workspaces/w/tree/"* | sort -V | tail -2 | head -1)
[[ -z $(find "$LAYERFS_STORE/layers/$moment" "$own" -name '.nfs*') ]] ||
	fail "a layer holds the client's file: $(find "$LAYERFS_STORE/layers/$moment" "$own" -name '.nfs*')"
[[ $(cat /proc/self/fd/7) == "still open" ]] || fail "the open file after the commit"
exec 7>&-
for _ in $(seq 50); do [[ -z $(cd "$w" && ls -A | grep '^\.nfs') ]] && break; sleep 0.1; done
[[ -z $(cd "$w" && ls -A | grep '^\.nfs') ]] || fail "the client's .nfs name is left after the close"

step "kill -9 of the daemon under a writer; a restart; the writer finishes"
dd if=/dev/urandom of="$t/src" bs=256k count=64 status=none
want=$(sha256sum <"$t/src" | cut -d' ' -f1)
(
	for i in $(seq 0 63); do
		dd if="$t/src" of="$w/big" bs=256k skip=$i seek=$i count=1 conv=notrunc,fsync status=none ||
			{ echo "write $i failed"; exit 1; }
	done
) >"$t/writer.log" 2>&1 &
writer=$!
for _ in $(seq 600); do
	[[ $(stat -c %s "$w/big" 2>/dev/null || echo 0) -ge $((4 * 262144)) ]] && break
	sleep 0.05
done
old=$(daemon_pid)
[[ -n $old ]] || fail "no daemon"
written=$(stat -c %s "$w/big")
# The kill must land under the writer, or it tests nothing.
kill -0 "$writer" 2>/dev/null || fail "the writer was not running at the kill ($written bytes written)"
kill -9 "$old"
echo "   killed the daemon (pid $old) with $written bytes written, the writer running"
"$layerfs" daemon --store /run/lfs-store >"$t/daemon2.log" 2>&1 &
restarted=$!
wait "$writer" || fail "the writer failed: $(cat "$t/writer.log")"
# Read from the server, not from the guest's page cache.
sync
echo 3 >/proc/sys/vm/drop_caches
got=$(sha256sum <"$w/big" | cut -d' ' -f1)
[[ $got == "$want" ]] || fail "checksum $got after the crash, wrote $want"
check "$w/new" new
check "$w2/etc/name" changed
ls -la "$w" >/dev/null || fail "listing after the restart"
[[ $("$layerfs" ls | awk '$1 == "w" {print $3}') == mounted ]] || fail "ls: $("$layerfs" ls)"

step "unmount by path; SIGTERM unmounts the rest, exits 0, leaves no mount"
"$layerfs" unmount "$w2"
nfs_mounted "$w2" && fail "w2 still mounted"
kill -TERM "$restarted"
rc=0
wait "$restarted" || rc=$?
[[ $rc == 0 ]] || fail "exit status $rc after SIGTERM: $(tail -5 "$t/daemon2.log")"
nfs_mounted "$w" && fail "w still mounted after SIGTERM"
echo "PASSED: the daemon through the kernel NFS client"
