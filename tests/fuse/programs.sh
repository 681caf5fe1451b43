#!/usr/bin/env bash
# Everyday programs on a workspace served through the FUSE door, next to the
# same tree in a plain directory (what Linux itself does): git (commit, gc,
# fsck, branches), make with cc (a build, a rebuild after a change, up to
# date after it), sqlite3 (a transaction, WAL mode, an integrity check), a
# shared mmap written into a lower file, flock and tar. Each program's
# output must be the same on both. Run twice: as root (passthrough), and as
# a user who is not root through that user's own door (fusermount3, the
# kernel's writeback cache), where /dev/fuse is open to users.
# Needs root, /dev/fuse, git, make, cc, sqlite3 and flock; says SKIPPED
# without them (tests/skip.sh).
# usage: tests/fuse/programs.sh LAYERFS
set -euo pipefail
layerfs=$(realpath "$1")
source "$(dirname "$0")/../lib.sh"
name="programs through the FUSE door"
if [[ ! -c /dev/fuse || $(id -u) != 0 ]]; then
	skip_or_fail "$name" "needs root and /dev/fuse"
	exit 0
fi
for tool in git make cc sqlite3 flock; do
	if ! command -v $tool >/dev/null; then
		skip_or_fail "$name" "$tool is not installed"
		exit 0
	fi
done
t=$(mktemp -d /tmp/layerfs-programs.XXXXXX)
chmod 755 "$t"
cleanup() {
	unmount_under "$t"
	rm -rf "$t"
}
trap cleanup EXIT

# A program that writes through a shared mapping of an existing file.
cat >"$t/mapwrite.c" <<'EOF'
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
	int fd = open(argv[1], O_RDWR);
	if (fd < 0) return 1;
	char *p = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) return 2;
	memcpy(p + 4096, "mapped", 6);
	if (msync(p, 8192, MS_SYNC) || munmap(p, 8192) || close(fd)) return 3;
	return 0;
}
EOF
cc -O -o "$t/mapwrite" "$t/mapwrite.c"

# The lower layer: a git repository with one commit, a C project, a file to map.
lower() {
	local d=$1
	mkdir -p "$d/repo" "$d/proj"
	git -C "$d/repo" init -q -b main
	for i in $(seq 1 40); do echo "line $i" >"$d/repo/f$i.txt"; done
	git -C "$d/repo" add .
	GIT_COMMITTER_DATE=@1700000000 git -C "$d/repo" -c user.name=l -c user.email=l@l commit -q --date=@1700000000 -m one
	printf 'int f(void);\nint main(void) { return f(); }\n' >"$d/proj/main.c"
	printf 'int f(void) { return 0; }\n' >"$d/proj/f.c"
	printf 'prog: main.o f.o\n\tcc -o $@ main.o f.o\n%%.o: %%.c\n\tcc -c -o $@ $<\n' >"$d/proj/Makefile"
	head -c 8192 /dev/zero >"$d/mapped"
}

# What a user does in directory $1, each step's output on stdout.
work() (
	cd "$1"
	step() { echo "== $*"; }
	step git
	git -C repo status --porcelain | wc -l
	echo changed >>repo/f1.txt
	git -C repo commit -q -am two && git -C repo log --oneline | wc -l
	git -C repo gc -q && git -C repo fsck --no-progress --no-dangling 2>&1
	git -C repo checkout -q -b side && git -C repo rm -q f2.txt && git -C repo commit -q -m three
	git -C repo checkout -q main && ls repo | wc -l
	git -C repo diff --stat main side | tail -1
	step make
	make -s -C proj && ./proj/prog && echo built
	touch proj/f.c && make -s -C proj && make -q -C proj && echo "up to date"
	step sqlite3
	sqlite3 db "create table t(a); begin; $(for i in $(seq 300); do printf 'insert into t values(%d);' "$i"; done) commit;
		pragma journal_mode=wal; insert into t values(0); select count(*), sum(a) from t; pragma integrity_check;"
	step mmap
	"$MAPWRITE" mapped && dd if=mapped bs=1 skip=4096 count=6 status=none && echo
	step flock
	flock proj/Makefile true && echo locked
	step tar
	tar -cf - proj/main.c proj/f.c proj/Makefile mapped | tar -tvf - | awk '{print $3, $6}'
	find proj -type f | sort | xargs cksum
)

# Runs `work` as "$@" (a command prefix) on the door and on the plain copy.
compare() {
	local who=$1
	shift
	rm -rf "$t/lower" "$t/plain" "$t/upper" "$t/home"
	mkdir -p "$t/lower" "$t/plain" "$t/upper" "$t/m" "$t/home"
	lower "$t/lower"
	cp -a "$t/lower/." "$t/plain/"
	printf '[user]\n\tname = u\n\temail = u@u\n[safe]\n\tdirectory = *\n' >"$t/home/.gitconfig"
	if [[ $who != root ]]; then chown -R "$who:$who" "$t/lower" "$t/plain" "$t/upper" "$t/m" "$t/home"; fi
	("$@" "$layerfs" serve --fuse "$t/m" --layer "$t/lower" --upper "$t/upper" >"$t/door.log" 2>&1 &)
	for _ in $(seq 100); do mounted "$t/m" && break; sleep 0.1; done
	mounted "$t/m" || { cat "$t/door.log"; fail "the door as $who did not mount"; }
	local run=(env HOME="$t/home" MAPWRITE="$t/mapwrite" GIT_AUTHOR_DATE=@1700000100 GIT_COMMITTER_DATE=@1700000100)
	"$@" "${run[@]}" bash -c "$(declare -f work); work $t/m" >"$t/door.out" 2>&1 || true
	"$@" "${run[@]}" bash -c "$(declare -f work); work $t/plain" >"$t/plain.out" 2>&1 || true
	fusermount3 -u "$t/m" 2>/dev/null || umount "$t/m"
	if ! diff -u "$t/plain.out" "$t/door.out"; then
		fail "programs as $who behave differently through the door (- plain directory, + door)"
	fi
	# Each step ran to its end: an empty or failing run must not pass.
	for want in "^40$" "1 file changed, 1 deletion" "^built$" "^up to date$" "^301|45150$" "^ok$" "^mapped$" "^locked$"; do
		grep -q "$want" "$t/door.out" || { cat "$t/door.out"; fail "as $who: no line $want"; }
	done
	echo "the same as a plain directory, as $who"
}

compare root
if setpriv --reuid=65534 --regid=65534 --clear-groups test -r /dev/fuse -a -w /dev/fuse; then
	compare 65534 setpriv --reuid=65534 --regid=65534 --clear-groups
else
	skip_or_fail "$name as a user" "/dev/fuse is not open to users (chmod 666 /dev/fuse)"
fi
echo "PASSED: $name"
