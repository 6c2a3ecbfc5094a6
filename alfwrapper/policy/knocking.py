"""Port knocking: the sequences (static or derived from a secret), and the client side.

Secret-derived sequences: window w = floor(UTC seconds / window); the ports
of window w are HMAC-SHA256(secret, "alfwrapper-knock" || w as 8 bytes),
read two bytes at a time, mapped into 1024..65535, with no port repeated in
a sequence.  The wrapper writes the sequences of a horizon of windows into
the filter's map, from the window before start-up on; the filter picks the
row from the kernel's TAI clock (bpf_ktime_get_tai_ns, Linux 6.1) plus the
TAI-to-UTC offset measured at start-up.
"""

from __future__ import annotations

import errno
import select
import socket
import time

from alfwrapper.errors import EX_DATAERR, EX_OSERR, EX_USAGE, AlfError
from alfwrapper.policy.inputs import SECRET_LIMIT, read_input
from alfwrapper.policy.rules import KnockRules
from alfwrapper.record import Record

MAX_STEPS = 8  # KNOCK_MAX_STEPS in knocking.c
HORIZON_SECONDS = 7 * 86400
FIRST_PORT = 1024
_LABEL = b"alfwrapper-knock"


class KnockPlan(Record):
    """The rows of knock_ports and the knock_config values."""

    rows: int
    ports: tuple[tuple[int, ...], ...]
    first_window: int
    steps: int


def read_secret(path: str) -> bytes:
    secret = read_input(path, "knock secret", SECRET_LIMIT).strip()
    if len(secret) < 16:
        raise AlfError(
            f"knock secret {path}",
            f"only {len(secret)} bytes",
            "use at least 16 random bytes, e.g. head -c 32 /dev/urandom | base64",
            EX_DATAERR,
        )
    return secret


def secret_ports(secret: bytes, window: int, steps: int) -> tuple[int, ...]:
    """The knock sequence of one time window."""
    import hashlib  # noqa: PLC0415  (OpenSSL: 5 ms a start without a secret need not pay)
    import hmac  # noqa: PLC0415

    ports: list[int] = []
    counter = 0
    while len(ports) < steps:
        digest = hmac.new(
            secret, _LABEL + window.to_bytes(8, "big") + bytes([counter]), hashlib.sha256
        ).digest()
        for i in range(0, len(digest), 2):
            port = FIRST_PORT + int.from_bytes(digest[i : i + 2], "big") % (65536 - FIRST_PORT)
            if port not in ports and len(ports) < steps:
                ports.append(port)
        counter += 1
    return tuple(ports)


def utc_window(window_seconds: int, now: float | None = None) -> int:
    return int((time.time() if now is None else now) // window_seconds)


def check_sequence(ports: tuple[int, ...]) -> None:
    for a, b in zip(ports, ports[1:], strict=False):
        if a == b:
            raise AlfError(
                "--knock",
                f"port {a} follows itself",
                "consecutive knocks must use different ports (a repeat is taken "
                "for a retransmission)",
                EX_USAGE,
            )


def plan_knock(rules: KnockRules, now: float | None = None) -> KnockPlan:
    if rules.spa:  # a datagram, not sequences: no rows (knock_ports is one empty row)
        return KnockPlan(rows=1, ports=((),), first_window=0, steps=1)
    if not rules.secret:
        check_sequence(rules.ports)
        return KnockPlan(rows=1, ports=(rules.ports,), first_window=0, steps=len(rules.ports))
    first = utc_window(rules.window, now) - 1
    rows = HORIZON_SECONDS // rules.window + 2
    ports = tuple(secret_ports(rules.secret, first + r, rules.steps) for r in range(rows))
    return KnockPlan(rows=rows, ports=ports, first_window=first, steps=rules.steps)


def tai_to_utc_ns() -> int:
    """CLOCK_REALTIME minus CLOCK_TAI: what the filter adds to its TAI clock."""
    return time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_TAI)


def send_knocks(
    host: str, port: int, ports: tuple[int, ...], udp: bool = False, gap: float = 0.05
) -> None:
    """Knock: one SYN (or datagram) to host:port from each source port, in order.

    A TCP knock is a non-blocking connect that is abandoned after the SYN
    has left, so the kernel sends it exactly once.
    """
    try:
        info = socket.getaddrinfo(
            host, port, type=socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
        )[0]
    except socket.gaierror as err:
        raise AlfError(
            f"knock {host}", str(err.strerror), "give a reachable host name or address", EX_USAGE
        ) from None
    family, kind, _, _, target = info
    for source in ports:
        with socket.socket(family, kind) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", source))
                if udp:
                    sock.sendto(b"knock", target)
                else:
                    sock.setblocking(False)
                    code = sock.connect_ex(target)
                    if code not in (0, errno.EINPROGRESS):
                        raise OSError(code, errno.errorcode.get(code, str(code)))
                    select.select([], [], [], gap)  # let the SYN leave
            except OSError as err:
                raise AlfError(
                    f"knocking from port {source}",
                    err.strerror or str(err),
                    "is that source port free here?",
                    EX_OSERR,
                ) from None
        time.sleep(gap)
