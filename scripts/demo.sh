#!/bin/sh
# `make run`: the echo service behind alfwrapper with the demo policy.
set -eu
cd "$(dirname "$0")/.."
PORT=${PORT:-8080}
cat <<BANNER
alfwrapper demo: examples/echo_server.py on TCP and UDP port $PORT ([::], dual-stack),
filtered by examples/demo.rules: allowed 127.0.0.1, ::1, 192.0.2.0/24, 2001:db8::/32;
everything else is dropped silently, even other loopback addresses.

Try it from another terminal:
  echo hello | ncat 127.0.0.1 $PORT                 # answered: echo hello
  echo hello | ncat ::1 $PORT                       # answered
  (echo hello; sleep 1) | ncat -u 127.0.0.1 $PORT   # answered (UDP)
  echo hello | ncat -w 3 -s 127.0.0.2 127.0.0.1 $PORT   # dropped: times out, no "refused"
Each line the service receives is printed below.  Stop with Ctrl-C.

BANNER
exec .venv/bin/alfwrapper \
    --listen "[::]:$PORT" --name echo \
    --listen-datagram "[::]:$PORT" --name echo-udp \
    --allow-file examples/demo.rules \
    -- /usr/bin/python3 examples/echo_server.py
