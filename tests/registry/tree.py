#!/usr/bin/env python3
"""One line per entry of a tree, sorted: path, type, mode, owner, size,
content digest or link target, and the first path of a file with several
names; with --xattrs, the entry's user. attributes too. Two trees are the
same when their listings are."""
import hashlib
import os
import stat
import sys

root = sys.argv[1]
with_xattrs = "--xattrs" in sys.argv[2:]
first = {}
lines = []
for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    for name in sorted(dirnames + filenames):
        path = os.path.join(dirpath, name)
        rel = os.path.relpath(path, root)
        st = os.lstat(path)
        kind = stat.S_IFMT(st.st_mode)
        what = ""
        if stat.S_ISREG(kind):
            with open(path, "rb") as f:
                what = hashlib.sha256(f.read()).hexdigest()[:16]
        elif stat.S_ISLNK(kind):
            what = "-> " + os.readlink(path)
        elif stat.S_ISCHR(kind) or stat.S_ISBLK(kind):
            what = f"dev {os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
        link = ""
        if not stat.S_ISDIR(kind) and st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            link = "=" + first.setdefault(key, rel) if key in first else ""
            first.setdefault(key, rel)
        size = st.st_size if stat.S_ISREG(kind) else 0
        xattrs = ""
        if with_xattrs and not stat.S_ISLNK(kind):
            names = sorted(n for n in os.listxattr(path, follow_symlinks=False) if n.startswith("user."))
            xattrs = " ".join(f"{n}={os.getxattr(path, n, follow_symlinks=False)!r}" for n in names)
        lines.append(f"{rel} {stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid} {size} {what} {link} {xattrs}".rstrip())
print("\n".join(sorted(lines)))
