#!/bin/sh
# docs/knocking.md's knocking example, run and checked: the echo service behind a
# knock, knocked open once with `alfwrapper knock` and once with ncat.
# Run from the repository after `make setup`, as root.  PORT defaults to 8080.
set -eu
cd "$(dirname "$0")/.."
PORT=${PORT:-8080}
SEQ=7001,7002,7003
.venv/bin/alfwrapper --listen "[::]:$PORT" --knock $SEQ \
    -- /usr/bin/python3 examples/echo_server.py &
service=$!
trap 'kill $service 2>/dev/null' EXIT
i=0
until ss -ltn "sport = :$PORT" | grep -q LISTEN; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "service did not start" >&2; exit 1; }
    sleep 0.1
done

expect() {  # expect WHAT COMMAND...: WHAT is "echo" or "timeout"
    want=$1; shift
    if got=$("$@" 2>/dev/null) && [ "$got" = "echo hi" ]; then got=echo; else got=timeout; fi
    echo "$want: $*"
    [ "$got" = "$want" ] || { echo "  but got $got" >&2; exit 1; }
}

expect timeout sh -c "echo hi | ncat -w 2 127.0.0.1 $PORT"
.venv/bin/alfwrapper knock 127.0.0.1 "$PORT" --sequence $SEQ
expect echo sh -c "echo hi | ncat -w 2 127.0.0.1 $PORT"

expect timeout sh -c "echo hi | ncat -w 2 -s 127.0.0.2 127.0.0.1 $PORT"
for p in 7001 7002 7003; do ncat -w 1 -s 127.0.0.2 -p $p 127.0.0.1 "$PORT" </dev/null || true; done
expect echo sh -c "echo hi | ncat -w 2 -s 127.0.0.2 127.0.0.1 $PORT"
echo "knocking works with alfwrapper knock and with ncat"
