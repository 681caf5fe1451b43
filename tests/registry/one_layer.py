#!/usr/bin/env python3
"""An OCI image layout of one gzip layer, written by hand so that it can be
wrong where tools would not let it: a config whose diff_id is not the
layer's, or a layer of a media type no image has.
usage: one_layer.py LAYOUT (right|wrong-diff) MEDIA_TYPE"""
import gzip, hashlib, io, json, os, sys, tarfile
layout, wrong_diff, media = sys.argv[1], sys.argv[2] == "wrong-diff", sys.argv[3]
os.makedirs(f"{layout}/blobs/sha256", exist_ok=True)
def blob(data):
    d = hashlib.sha256(data).hexdigest()
    open(f"{layout}/blobs/sha256/{d}", "wb").write(data)
    return f"sha256:{d}", len(data)
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w") as tar:
    info = tarfile.TarInfo("hello"); data = b"hello\n"; info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
tar_bytes = raw.getvalue()
diff_id = "sha256:" + hashlib.sha256(tar_bytes).hexdigest()
if wrong_diff:
    diff_id = "sha256:" + "0" * 64
layer_digest, layer_size = blob(gzip.compress(tar_bytes, mtime=0))
config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
cfg_digest, cfg_size = blob(config)
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": cfg_size},
    "layers": [{"mediaType": media, "digest": layer_digest, "size": layer_size}]}).encode()
m_digest, m_size = blob(manifest)
json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m_digest, "size": m_size, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}, open(f"{layout}/index.json", "w"))
open(f"{layout}/oci-layout", "w").write('{"imageLayoutVersion": "1.0.0"}')
