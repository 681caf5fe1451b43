#!/usr/bin/env python3
"""A registry on 127.0.0.1 that answers every manifest with one larger than
4 MiB (registry:2 refuses to store or serve one, so a test that needs it
serves it itself). usage: huge_manifest.py PORT"""
import hashlib
import http.server
import json
import sys

port = int(sys.argv[1])
config = {"mediaType": "application/vnd.oci.image.config.v1+json",
          "digest": "sha256:" + "0" * 64, "size": 2}
body = json.dumps({"schemaVersion": 2,
                   "mediaType": "application/vnd.oci.image.manifest.v1+json",
                   "config": config, "layers": [],
                   "annotations": {"pad": "x" * (5 << 20)}}).encode()
digest = "sha256:" + hashlib.sha256(body).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v2/":
            self.answer(b"{}", "application/json")
        elif "/manifests/" in self.path:
            self.answer(body, "application/vnd.oci.image.manifest.v1+json")
        else:
            self.send_error(404)

    do_HEAD = do_GET

    def answer(self, data, media_type):
        self.send_response(200)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(data)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
