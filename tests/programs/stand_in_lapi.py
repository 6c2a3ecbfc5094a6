"""A stand-in for CrowdSec's Local API in the boot tier's guest: GET
/v1/decisions/stream with the right X-Api-Key answers one ban (an Ip decision on
the address given) at startup and nothing new after, as crowdsec 1.4.6 writes it
(null lists).  The real LAPI (Debian's crowdsec) is what tests/netns/
test_crowdsec.py runs; this one lets the guest hold the unit as shipped without a
second daemon on the guest's ports.

    python3 stand_in_lapi.py PORT KEY ADDRESS
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse

PORT, KEY, ADDRESS = int(sys.argv[1]), sys.argv[2], sys.argv[3]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's name
        url = urlparse(self.path)
        if url.path != "/v1/decisions/stream" or self.headers.get("X-Api-Key") != KEY:
            self.send_response(403)
            self.end_headers()
            return
        startup = parse_qs(url.query).get("startup") == ["true"]
        ban = {"id": 1, "origin": "cscli", "type": "ban", "scope": "Ip", "value": ADDRESS,
               "duration": "59m58.123456789s", "scenario": "manual"}  # fmt: skip
        body = json.dumps({"new": [ban] if startup else None, "deleted": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


HTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
