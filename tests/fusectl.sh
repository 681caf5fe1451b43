# The kernel's count of a FUSE mount's requests waiting for an answer,
# read from fusectl without asking the mount's server (a stat of the mount
# would wait for it too). Sourced by the tests that show a request reaches
# the daemon: made while no daemon serves, it waits. Needs root.

# fuse_waiting MOUNT: the number of MOUNT's requests waiting, or "none".
fuse_waiting() {
	grep -q " /sys/fs/fuse/connections fusectl " /proc/mounts ||
		mount -t fusectl fusectl /sys/fs/fuse/connections 2>/dev/null || true
	local minor
	minor=$(awk -v m="$1" '$5 == m {split($3, d, ":"); print d[2]}' /proc/self/mountinfo)
	cat "/sys/fs/fuse/connections/$minor/waiting" 2>/dev/null || echo none
}
