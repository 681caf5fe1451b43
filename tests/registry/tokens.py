#!/usr/bin/env python3
"""A registry token service on 127.0.0.1, after the registry token protocol
(distribution's docs/spec/auth/token.md): GET /token with HTTP basic auth
for USER:PASSWORD answers a JWT for the scopes asked, signed RS256 with KEY
(through `openssl dgst`), carrying CERT in its x5c header, that expires
LIFETIME seconds after it is issued. Anything else gets 401.

STATE_FILE holds {"issued": N, "tokens": [...]}, rewritten at each token, so
a test can count renewals and look for the tokens in logs.

usage: tokens.py PORT KEY CERT USER:PASSWORD LIFETIME STATE_FILE
(issuer and service: "layerfs-test")"""
import base64
import http.server
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.parse

port, key, cert, creds, lifetime, state_file = sys.argv[1:7]
lifetime = int(lifetime)
NAME = "layerfs-test"
with open(cert) as f:
    x5c = base64.b64encode(ssl.PEM_cert_to_DER_cert(f.read())).decode()
expected = "Basic " + base64.b64encode(creds.encode()).decode()
state = {"issued": 0, "tokens": []}


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(payload):
    return subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", key],
        input=payload, capture_output=True, check=True,
    ).stdout


def token(scopes):
    now = int(time.time())
    access = []
    for scope in scopes:
        # repository:NAME:ACTIONS, where NAME may hold no colon here.
        kind, name, actions = scope.split(":", 2)
        access.append({"type": kind, "name": name, "actions": actions.split(",")})
    header = {"typ": "JWT", "alg": "RS256", "x5c": [x5c]}
    claims = {
        "iss": NAME, "sub": creds.split(":")[0], "aud": NAME,
        "exp": now + lifetime, "nbf": now - 1, "iat": now,
        "jti": f"{now}-{state['issued']}", "access": access,
    }
    signed = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
    return signed + "." + b64url(sign(signed.encode()))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/token" or self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.end_headers()
            return
        scopes = urllib.parse.parse_qs(url.query).get("scope", [])
        issued = token(scopes)
        state["issued"] += 1
        state["tokens"].append(issued)
        tmp = state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, state_file)
        body = json.dumps({"token": issued, "access_token": issued, "expires_in": lifetime}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), Handler).serve_forever()
