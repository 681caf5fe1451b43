#!/usr/bin/env bash
# Lazy pull through the Linux kernel NFS client: tests/registry/lazy.sh and
# tests/registry/converters.sh with their workspaces mounted over NFS, run
# in the QEMU guest by
# tools/kernel-client/run --no-mount (the guest's /run keeps inode numbers,
# its /tmp does not).
# usage (in the guest): tests/kernel/lazy.sh
set -euo pipefail
layerfs=${LAYERFS:-$PWD/target/release/layerfs}
# The guest runs a copy of this file; the repository is the working directory.
export LAYERFS_LAZY_DOOR=nfs LAYERFS_LAZY_DIR=/run
"$PWD/tests/registry/lazy.sh" "$layerfs"
exec "$PWD/tests/registry/converters.sh" "$layerfs"
