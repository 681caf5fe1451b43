#!/usr/bin/env python3
"""Files held open across a daemon's crash or upgrade, then used again.

usage: held.py DIR LOWER SIGNAL

In DIR, a mounted workspace in which LOWER (a path relative to DIR) is a
file of the workspace's layers never written: opens an upper file for
appending and for reading, a new file for writing, LOWER for reading, and
maps a second upper file shared (which it writes in capitals once told to
go on), and opens a fourth for reading and writing and removes its name. Writes `held` to SIGNAL and waits until
SIGNAL says `go` (the daemon was killed and started again, or upgraded, in
between). Then: uses every held descriptor and the mapping; opens each file
again while the first descriptors are held; closes everything; and opens,
reads, writes, appends to (LOWER: a copy-up) and stats each file once more.
Last, checks what each file holds; the file with no name is checked
through its descriptor before it is closed. Prints `ok` and exits 0, or names the
first call that failed or the file that reads wrong and exits 1.
"""
import mmap
import os
import sys
import time


# What each file holds after a run, by name relative to DIR.
EXPECTED = {
    "held-append": "first\nheld\nreopened\nafter\n",
    "held-new": "new\nheld\nafter\n",
    "held-mapped": "MAPPED-BEFORE-TAKEOVER\n",
}


def main(root, lower, signal):
    path = lambda name: os.path.join(root, name)
    step = "setting up"
    try:
        with open(path("held-append"), "w") as f:
            f.write("first\n")
        with open(path("held-mapped"), "w") as f:
            f.write("mapped-before-takeover\n")
        step = "opening the files to hold"
        append = os.open(path("held-append"), os.O_WRONLY | os.O_APPEND)
        reader = os.open(path("held-append"), os.O_RDONLY)
        new = os.open(path("held-new"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(new, b"new\n")
        low = os.open(path(lower), os.O_RDONLY)
        low_bytes = os.pread(low, 1 << 16, 0)
        mapped = os.open(path("held-mapped"), os.O_RDWR)
        area = mmap.mmap(mapped, 0)
        unlinked = os.open(path("held-unlinked"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(unlinked, b"before\n")
        os.unlink(path("held-unlinked"))
        with open(signal, "w") as f:
            f.write("held\n")
        deadline = time.monotonic() + 120
        while open(signal).read().strip() != "go":
            if time.monotonic() > deadline:
                sys.exit("never told to go on")
            time.sleep(0.02)

        step = "writing through the held descriptors"
        os.write(append, b"held\n")
        os.write(new, b"held\n")
        step = "reading through the held descriptors"
        if os.pread(reader, 100, 0) != b"first\nheld\n":
            sys.exit("the held reader read %r" % os.pread(reader, 100, 0))
        if os.pread(low, 1 << 16, 0) != low_bytes:
            sys.exit("the held lower file reads differently")
        step = "writing to the held file with no name"
        os.write(unlinked, b"after\n")
        os.fsync(unlinked)
        step = "reading the held file with no name"
        got = os.pread(unlinked, 100, 0)
        if got != b"before\nafter\n":
            sys.exit("the held file with no name reads %r" % got)
        step = "stat of the held file with no name"
        st = os.fstat(unlinked)
        if (st.st_nlink, st.st_size) != (0, len(got)):
            sys.exit("the held file with no name has %d links and %d bytes" % (st.st_nlink, st.st_size))
        if os.path.lexists(path("held-unlinked")):
            sys.exit("held-unlinked has a name again")
        step = "writing through the mapping"
        area[:] = area[:].upper()
        area.flush()

        step = "opening again while the first descriptors are held"
        for name, flags in [
            ("held-append", os.O_WRONLY | os.O_APPEND),
            ("held-append", os.O_RDONLY),
            ("held-new", os.O_RDWR),
            (lower, os.O_RDONLY),
            ("held-mapped", os.O_RDONLY),
        ]:
            step = "opening %s again while held (flags %o)" % (name, flags)
            fd = os.open(path(name), flags)
            if name == "held-append" and flags & os.O_APPEND:
                os.write(fd, b"reopened\n")
            elif flags & os.O_ACCMODE == os.O_RDONLY:
                os.pread(fd, 100, 0)
            os.close(fd)

        step = "closing"
        area.close()
        for fd in (append, reader, new, low, mapped, unlinked):
            os.close(fd)

        for name in ("held-append", "held-new", "held-mapped", lower):
            step = "reading %s after its descriptors were closed" % name
            with open(path(name), "rb") as f:
                f.read()
            step = "stat of %s after its descriptors were closed" % name
            os.stat(path(name))
        step = "appending to held-append and held-new after the close"
        for name in ("held-append", "held-new"):
            with open(path(name), "a") as f:
                f.write("after\n")
        step = "appending to %s (a copy-up) after the close" % lower
        with open(path(lower), "ab") as f:
            f.write(b"appended\n")
        with open(path(lower), "rb") as f:
            if f.read() != low_bytes + b"appended\n":
                sys.exit("%s after its copy-up reads wrong" % lower)
        for name, want in EXPECTED.items():
            step = "reading %s to check it" % name
            with open(path(name)) as f:
                got = f.read()
            if got != want:
                sys.exit("%s holds %r, not %r" % (name, got, want))
    except OSError as e:
        sys.exit("%s: %s" % (step, e))
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
