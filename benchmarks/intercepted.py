#!/usr/bin/python3
"""A daemon's own binds under alfwrapper's interception (lifecycle/intercept.py), side by
side with the same daemon alone: the time of one bind and of one listen, and the bind
supervisor's memory; and Debian's nginx serving ab(1) (apache2-utils) alone, behind
alfwrapper binding its own socket (intercepted), and on a socket alfwrapper hands it
(NGINX): requests per second, rounds alternated, medians.  As root.

    intercepted.py [--smoke] [--json]

The daemon binds COUNT UDP sockets and makes COUNT TCP sockets listen, each on a port of
its own on the loopback, timing each call; the figures are medians.  Each intercepted
socket gets its pinned state and its program (from the program cache) before the call is
done, as any socket of --listen does at a start."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAEMON = r"""
import json, os, socket, sys, time
count, base = int(sys.argv[1]), int(sys.argv[2])
binds, listens, held = [], [], []
for i in range(count):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    begin = time.perf_counter(); u.bind(("127.0.0.1", base + i))
    binds.append(time.perf_counter() - begin)
    t = socket.socket(); t.bind(("127.0.0.1", base + count + i))
    begin = time.perf_counter(); t.listen(8); listens.append(time.perf_counter() - begin)
    held += [u, t]
print(json.dumps([binds, listens]), flush=True)
sys.stdin.read(1)  # held until the bench has read the supervisor's memory
"""


def run(count: int, base: int, wrapped: bool) -> dict[str, float]:
    argv = [sys.executable, "-c", DAEMON, str(count), str(base)]
    if wrapped:
        argv = [sys.executable, "-m", "alfwrapper", "--service", "benchbind",
                "--allow", "127.0.0.0/8", "--", *argv]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None and proc.stdin is not None
    binds, listens = json.loads(proc.stdout.readline())
    rss = supervisor_rss() if wrapped else 0.0
    proc.stdin.write("x")
    proc.stdin.close()
    proc.wait(timeout=60)
    return {
        "bind_ms": statistics.median(binds) * 1e3,
        "listen_ms": statistics.median(listens) * 1e3,
        "supervisor_mib": rss,
    }


def supervisor_rss() -> float:
    found = subprocess.run(
        ["pgrep", "-f", "alfwrapper-bind benchbind"], capture_output=True, text=True, check=False
    )
    for pid in found.stdout.split():
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return 0.0


NGINX_CONF = """daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
worker_processes 2;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {folder};
  proxy_temp_path {folder};
  fastcgi_temp_path {folder};
  uwsgi_temp_path {folder};
  scgi_temp_path {folder};
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok"; }} }}
}}
"""
NGINX_WAYS = ("alone", "intercepted", "handed")


def nginx_rps(way: str, port: int, requests: int) -> float:
    """Requests per second ab gets from nginx started ``way`` (a new connection each)."""
    folder = Path(tempfile.mkdtemp(prefix="alf-bench-nginx-", dir="/var/tmp"))
    try:
        (folder / "nginx.conf").write_text(NGINX_CONF.format(folder=folder, port=port))
        argv = ["/usr/sbin/nginx", "-c", str(folder / "nginx.conf"), "-p", str(folder)]
        rules = ["--service", "benchnginx", "--allow", "127.0.0.0/8"]
        if way == "intercepted":
            argv = [sys.executable, "-m", "alfwrapper", *rules, "--", *argv]
        elif way == "handed":
            argv = [sys.executable, "-m", "alfwrapper", "--listen", f"127.0.0.1:{port}",
                    *rules, "--", *argv]  # fmt: skip
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            url = f"http://127.0.0.1:{port}/"
            deadline = time.monotonic() + 60
            while subprocess.run(["ab", "-q", "-n", "1", url], capture_output=True,
                                 check=False).returncode != 0:  # fmt: skip
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"nginx ({way}) did not answer")
                time.sleep(0.2)
            ab = ["ab", "-q", "-n", str(requests), "-c", "8", url]
            out = subprocess.run(ab, capture_output=True, text=True, timeout=300, check=True)
            found = re.search(r"Requests per second:\s+([\d.]+)", out.stdout)
            assert found is not None, out.stdout
            return float(found.group(1))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def nginx_rounds(rounds: int, requests: int) -> dict[str, float]:
    got: dict[str, list[float]] = {way: [] for way in NGINX_WAYS}
    for i in range(rounds):
        for way in NGINX_WAYS if i % 2 == 0 else reversed(NGINX_WAYS):
            got[way].append(nginx_rps(way, 39500, requests))
    return {way: statistics.median(v) for way, v in got.items()}


def main() -> int:
    smoke = "--smoke" in sys.argv
    count = 5 if smoke else 50
    run(2, 39000, True)  # the program cache filled, as after a first start
    time.sleep(0.2)
    result = {
        "count": count,
        "alone": run(count, 39100, False),
        "intercepted": run(count, 39300, True),
    }
    requests = 500 if smoke else 20000  # nginx-light, apache2-utils: make setup
    result["nginx_requests"] = requests
    result["nginx_rps"] = nginx_rounds(1 if smoke else 5, requests)
    if "--json" in sys.argv:
        print(json.dumps(result))
    else:
        for key in ("alone", "intercepted"):
            print(key, result[key])
    return 0


if __name__ == "__main__":
    sys.exit(main())
