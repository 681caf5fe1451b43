#!/usr/bin/env python3
"""An OCI image layout whose layers have a shape other tools write and a
reader can get wrong, each gzip-compressed (a tar+gzip layer):

  members     the tar in three gzip members, one after another (eStargz's shape)
  sparse-V    a file with holes, archived by GNU tar --sparse --format=posix
              --sparse-version=V (V: 0.0, 0.1 or 1.0)
  d2f         two layers: d2f/ a directory with a file, then d2f a file
              followed by d2f/.wh.inner, as `umoci repack` writes it
  unpadded    the last entry's data ends the stream: no padding, no end
              blocks (as `umoci insert` writes), its diff_id of those bytes
  junk        a blob of binary bytes, newlines and escapes among them, that
              is no tar at all

usage: shaped_layer.py LAYOUT SHAPE
"""
import gzip, hashlib, io, json, os, subprocess, sys, tarfile, tempfile

layout, shape = sys.argv[1], sys.argv[2]
os.makedirs(f"{layout}/blobs/sha256", exist_ok=True)


def blob(data):
    d = hashlib.sha256(data).hexdigest()
    with open(f"{layout}/blobs/sha256/{d}", "wb") as f:
        f.write(data)
    return f"sha256:{d}", len(data)


def tar_of(entries):
    """A tar of (name, bytes or None for a directory), as tarfile writes it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


FILES = [("etc", None), ("etc/a", b"a\n" * 3000), ("etc/b", os.urandom(70_000)), ("etc/c", b"c\n")]

if shape == "members":
    tar = tar_of(FILES)
    thirds = [tar[: len(tar) // 3], tar[len(tar) // 3 : 2 * len(tar) // 3], tar[2 * len(tar) // 3 :]]
    layers = [(tar, b"".join(gzip.compress(part, mtime=0) for part in thirds))]
elif shape.startswith("sparse-"):
    version = shape.split("-", 1)[1]
    with tempfile.TemporaryDirectory() as src:
        os.mkdir(f"{src}/data")
        with open(f"{src}/data/holey", "wb") as f:
            f.truncate(4 << 20)
            f.write(b"at the start")
            f.seek(2 << 20)
            f.write(os.urandom(10_000))
            f.seek((4 << 20) - 5)
            f.write(b"end\n")
        with open(f"{src}/data/plain", "w") as f:
            f.write("plain\n")
        tar = subprocess.run(
            ["tar", "--sparse", "--format=posix", f"--sparse-version={version}",
             "--mtime=@1700000000", "--owner=0", "--group=0", "-C", src, "-cf", "-", "data"],
            check=True, capture_output=True).stdout
    layers = [(tar, gzip.compress(tar, mtime=0))]
elif shape == "d2f":
    first = tar_of([("d2f", None), ("d2f/inner", b"inner\n"), ("keep", b"keep\n")])
    second = tar_of([("d2f", b"now a file\n"), ("d2f/.wh.inner", b"")])
    layers = [(t, gzip.compress(t, mtime=0)) for t in (first, second)]
elif shape == "unpadded":
    whole = tar_of(FILES)
    # The last entry's header is a block of its own (no PAX record for
    # these names), then its data: everything up to there, and no more.
    last = FILES[-1][1]
    end = whole.rindex(last) + len(last)
    tar = whole[:end]
    layers = [(tar, gzip.compress(tar, mtime=0))]
elif shape == "junk":
    junk = bytes(range(256)) * 8 + b"\n\x1b[31mred\n\x07" + os.urandom(2048)
    layers = [(junk, gzip.compress(junk, mtime=0))]
else:
    sys.exit(f"unknown shape {shape}")

descriptors, diff_ids = [], []
for tar, compressed in layers:
    digest, size = blob(compressed)
    descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": size})
    diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
config = json.dumps({"architecture": "amd64", "os": "linux",
                     "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
cfg_digest, cfg_size = blob(config)
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": cfg_size},
    "layers": descriptors}).encode()
m_digest, m_size = blob(manifest)
with open(f"{layout}/index.json", "w") as f:
    json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": m_digest, "size": m_size, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}, f)
with open(f"{layout}/oci-layout", "w") as f:
    f.write('{"imageLayoutVersion": "1.0.0"}')
