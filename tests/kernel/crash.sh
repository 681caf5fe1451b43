#!/usr/bin/env bash
# The daemon killed at every step through the Linux kernel NFS client: the
# cycles of tests/daemon/crash.sh, its workspaces mounted over NFS, run in
# the QEMU guest by tools/kernel-client/run --no-mount (the guest's /run
# keeps inode numbers, its /tmp does not).
# usage (in the guest): tests/kernel/crash.sh [CYCLES]   (default 6: a cycle takes
# about 50 s under TCG)
set -euo pipefail
layerfs=${LAYERFS:-$PWD/target/release/layerfs}
# The guest runs a copy of this file; the repository is the working directory.
LAYERFS_CRASH_DOOR=nfs LAYERFS_CRASH_DIR=/run exec "$PWD/tests/daemon/crash.sh" "$layerfs" "${1:-6}"
