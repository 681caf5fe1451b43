#!/usr/bin/env python3
"""Writes an OCI image layout holding one eStargz layer made of the tree at
DIR, following the published format (containerd/stargz-snapshotter
docs/estargz.md): each regular file's data (each CHUNK bytes of it) in a
gzip member of its own, the table of contents (stargz.index.json) as the
last tar entry, the 51-byte footer pointing to it, and the layer's
annotation containerd.io/snapshot/stargz/toc.digest. The blob is a valid
gzip tar: any tool unpacks it. Each --above DIR adds one more layer made
the same way, on top. With --pack BYTES, files smaller than that share gzip
members of about that many bytes, each found by its innerOffset in its
member, as stargz-snapshotter packs files under its minimum chunk size.

usage: estargz.py DIR LAYOUT TAG [--chunk BYTES] [--pack BYTES] [--above DIR]..."""
import argparse
import datetime
import hashlib
import io
import json
import os
import stat
import tarfile
import zlib

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("layout")
p.add_argument("tag")
p.add_argument("--chunk", type=int, default=1 << 20)
p.add_argument("--above", action="append", default=[])
p.add_argument("--pack", type=int, default=0)
args = p.parse_args()


class Blob:
    def __init__(self):
        self.out = bytearray()
        self.raw = hashlib.sha256()
        self.size = 0
        self.member = None
        self.in_member = 0  # bytes written to the member so far

    def start(self):
        """Begins a new gzip member; returns its offset in the blob."""
        self.end()
        self.member = zlib.compressobj(6, zlib.DEFLATED, 31)
        self.in_member = 0
        return len(self.out)

    def end(self):
        if self.member is not None:
            self.out += self.member.flush()
            self.member = None

    def write(self, data):
        self.raw.update(data)
        self.size += len(data)
        self.in_member += len(data)
        self.out += self.member.compress(data)


def pad(n):
    return b"\0" * ((512 - n % 512) % 512)


def rfc3339(t):
    return datetime.datetime.fromtimestamp(int(t), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make_layer(top):
    """The eStargz blob of the tree at TOP, its diff id, its table and its
    uncompressed size."""
    blob = Blob()
    blob.start()
    toc = []
    # No file is prioritised: the landmark says so.
    paths = [(".no.prefetch.landmark", None)]
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(dirs + files):
            full = os.path.join(root, name)
            paths.append((os.path.relpath(full, top), full))
    links = {}
    packing = None  # the offset of the member packing small files
    for rel, full in paths:
        if full is None:
            info, data = tarfile.TarInfo(rel), b"\x0f"
            info.size, info.mode = 1, 0o644
            st = None
        else:
            st = os.lstat(full)
            info = tarfile.TarInfo(rel + ("/" if stat.S_ISDIR(st.st_mode) else ""))
            info.mode, info.uid, info.gid, info.mtime = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime
            data = b""
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(full)
            elif st.st_nlink > 1 and (st.st_dev, st.st_ino) in links:
                info.type, info.linkname = tarfile.LNKTYPE, links[(st.st_dev, st.st_ino)]
            else:
                links[(st.st_dev, st.st_ino)] = rel
                with open(full, "rb") as f:
                    data = f.read()
                info.size = len(data)
        entry = {
            "name": info.name,
            "type": {tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink"}.get(info.type, "reg"),
            "mode": info.mode,
            "uid": info.uid,
            "gid": info.gid,
            "modtime": rfc3339(info.mtime),
        }
        if info.linkname:
            entry["linkName"] = info.linkname
        blob.write(info.tobuf(tarfile.PAX_FORMAT))
        if entry["type"] != "reg":
            toc.append(entry)
            continue
        entry["size"] = len(data)
        entry["digest"] = sha(data)
        if 0 < len(data) < args.pack:
            # Into the member packing small files, or a new one once full.
            if packing is None or blob.in_member >= args.pack:
                packing = blob.start()
            entry.update(offset=packing, chunkDigest=sha(data))
            if blob.in_member:
                entry["innerOffset"] = blob.in_member
            toc.append(entry)
            blob.write(data + pad(len(data)))
            continue
        packing = None
        for at in range(0, len(data), args.chunk):
            chunk = data[at:at + args.chunk]
            last = at + args.chunk >= len(data)
            offset = blob.start()
            blob.write(chunk)
            if at == 0:
                entry.update(offset=offset, chunkSize=0 if last else len(chunk), chunkDigest=sha(chunk))
                toc.append(entry)
            else:
                toc.append({"name": info.name, "type": "chunk", "offset": offset, "chunkOffset": at,
                            "chunkSize": 0 if last else len(chunk), "chunkDigest": sha(chunk)})
        if not data:
            toc.append(entry)
        blob.write(pad(len(data)))
    toc_json = json.dumps({"version": 1, "entries": toc}).encode()
    toc_offset = blob.start()
    info = tarfile.TarInfo("stargz.index.json")
    info.size = len(toc_json)
    blob.write(info.tobuf(tarfile.USTAR_FORMAT) + toc_json + pad(len(toc_json)) + b"\0" * 1024)
    blob.end()
    footer = (b"\x1f\x8b\x08\x04\0\0\0\0\0\xff" + (26).to_bytes(2, "little") + b"SG" + (22).to_bytes(2, "little")
              + b"%016xSTARGZ" % toc_offset + b"\x01\x00\x00\xff\xff" + b"\0" * 8)
    assert len(footer) == 51
    layer = bytes(blob.out) + footer
    return layer, "sha256:" + blob.raw.hexdigest(), toc_json, blob.size


layers = [make_layer(top) for top in [args.dir] + args.above]
os.makedirs(os.path.join(args.layout, "blobs", "sha256"), exist_ok=True)


def put(data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(args.layout, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


config = json.dumps({"architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
                     "os": "linux", "config": {},
                     "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id, _, _ in layers]}}).encode()
manifest = json.dumps({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **put(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(layer),
                "annotations": {"containerd.io/snapshot/stargz/toc.digest": sha(toc_json),
                                "io.containers.estargz.uncompressed-size": str(size)}}
               for layer, _, toc_json, size in layers],
}).encode()
with open(os.path.join(args.layout, "oci-layout"), "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
with open(os.path.join(args.layout, "index.json"), "w") as f:
    json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", **put(manifest),
                                                 "annotations": {"org.opencontainers.image.ref.name": args.tag}}]}, f)
