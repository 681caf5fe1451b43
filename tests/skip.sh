# One policy for a check that cannot run here, sourced by the test scripts.
#
# `skipped NAME WHY` says SKIPPED and, where verify.sh collects them
# ($LAYERFS_SKIPS names a file), adds NAME to the list its summary prints.
# `skip_or_fail NAME WHY` does the same, except with LAYERFS_REQUIRE_MOUNTS=1
# (verify.sh sets it as root, where every such check can run): there it
# fails the script. The Rust tests follow the same rule (layerfs-testkit).
skipped() {
	echo "SKIPPED: $1: $2"
	if [[ -n ${LAYERFS_SKIPS:-} ]]; then echo "$1" >>"$LAYERFS_SKIPS"; fi
}
skip_or_fail() {
	if [[ ${LAYERFS_REQUIRE_MOUNTS:-} == 1 ]]; then
		echo "FAILED: $1 cannot run here, and LAYERFS_REQUIRE_MOUNTS=1: $2"
		exit 1
	fi
	skipped "$1" "$2"
}
