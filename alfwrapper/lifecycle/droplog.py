"""The drop log: reading and printing events (their layout is bpf/parts.py's), and
the journal forwarder.

With --log-drops RATE a socket's program puts an event for each dropped packet
into the socket's pinned ring buffer, at most RATE a second (filters/common.h).
`alfwrapper log` reads the ring buffers of a service; when the service runs
under systemd's journal, a small forwarder process (this module, run as
``python3 -m alfwrapper.lifecycle.droplog``) reads them instead and writes each event to
the journal with structured fields, from the service's own cgroup, so that
``journalctl -u UNIT`` shows the drops beside the application's lines.  A
ring buffer has one reading position: what the forwarder reads, `log` does not.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time
from collections.abc import Callable, Sequence

from alfwrapper.bpf import parts
from alfwrapper.host import bpf_calls, ringbuf
from alfwrapper.policy.prefixes import address_text
from alfwrapper.record import Record

PROTOCOLS = {6: "tcp", 17: "udp"}
JOURNAL_SOCKET = "/run/systemd/journal/socket"


class Event(Record):
    service: str
    socket: str
    ts_ns: int
    ifindex: int
    suppressed: int
    sport: int
    dport: int
    reason: str
    family: int
    proto: int
    source: str
    interface: str  # its name in the service's network namespace, else "#INDEX"; ""
    # for a packet judged from the queue (ifindex 0: a test run, lifecycle/backlog.py)

    @property
    def protocol(self) -> str:
        return PROTOCOLS.get(self.proto, str(self.proto))

    def fields(self) -> dict[str, object]:
        return {
            "service": self.service,
            "socket": self.socket,
            "source": self.source,
            "reason": self.reason,
            "protocol": self.protocol,
            "source_port": self.sport,
            "port": self.dport,
            "interface": self.interface or None,
            "suppressed_before": self.suppressed,
            "time": wall_clock(self.ts_ns),
        }

    def line(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_clock(self.ts_ns)))
        text = (
            f"{when} {self.service}/{self.socket}: dropped by {self.reason}: {self.source} "
            f"{self.protocol} port {self.dport} "
            + (f"via {self.interface}" if self.interface else "queued before the filter")
        )
        if self.suppressed:
            text += f" ({self.suppressed} more suppressed before this by the rate limit)"
        return text


def decode(
    service: str, socket_name: str, raw: bytes, name: Callable[[int], str] | None = None
) -> Event:
    """An event from the ring buffer; ``name`` names its interface (None: by index)."""
    ts, ifindex, suppressed, sport, dport, reason, family, proto, _, addr = parts.EVENT.unpack(
        raw[: parts.EVENT.size]
    )
    if family == 4:
        source = address_text(4, int.from_bytes(addr[:4], "big"))
    elif family == 6:
        source = address_text(6, int.from_bytes(addr, "big"))
    else:
        source = "?"
    names = parts.REASONS
    where = (name(ifindex) if name else f"#{ifindex}") if ifindex else ""
    return Event(service, socket_name, ts, ifindex, suppressed, sport, dport,
                 names[reason] if reason < len(names) else str(reason), family, proto,
                 source, where)  # fmt: skip


_BOOT_OFFSET = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


def wall_clock(ts_ns: int) -> float:
    """An event's time (bpf_ktime_get_coarse_ns(): CLOCK_MONOTONIC_COARSE, within a
    few ms of CLOCK_MONOTONIC) as wall-clock seconds."""
    return _BOOT_OFFSET + ts_ns / 1e9


def interface_name(index: int) -> str:
    try:
        return socket.if_indextoname(index)
    except OSError:
        return f"#{index}"


def read(
    rings: Sequence[tuple[str, str, int]],
    emit: Callable[[Event], None],
    follow: bool,
    name: Callable[[int], str] | None,
) -> None:
    """Read the ring buffers (service, socket name, map fd): what is buffered, and with
    ``follow`` everything after, until interrupted.  ``name`` names interfaces."""
    buffered: list[Event] = []
    sink: list[Callable[[Event], None]] = [buffered.append]
    reader = ringbuf.RingReader(
        [fd for _, _, fd in rings],
        lambda i, raw: sink[0](decode(rings[i][0], rings[i][1], raw, name)),
    )
    try:
        reader.consume()
        for event in sorted(buffered, key=lambda e: e.ts_ns):  # the sockets' logs, merged
            emit(event)
        sink[0] = emit
        while follow:
            reader.poll(1000)
    finally:
        reader.close()


def print_event(as_json: bool) -> Callable[[Event], None]:
    def emit(event: Event) -> None:
        print(json.dumps(event.fields()) if as_json else event.line(), flush=True)

    return emit


# -- the journal forwarder -----------------------------------------------------------


def journald_present() -> bool:
    """Is a journal listening (not just its socket file left behind)?"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(JOURNAL_SOCKET)
            return True
        except OSError:
            return False


def to_journal(event: Event) -> None:
    from systemd import journal  # noqa: PLC0415  (python3-systemd)

    journal.send(
        event.line().split(" ", 2)[2],
        PRIORITY=str(journal.LOG_NOTICE),
        SYSLOG_IDENTIFIER="alfwrapper",
        ALF_SERVICE=event.service,
        ALF_SOCKET=event.socket,
        ALF_SRC=event.source,
        ALF_VERDICT="drop",  # an Accept=yes peer reset before its command: "reset"
        ALF_REASON=event.reason,
        ALF_PROTOCOL=event.protocol,
        ALF_PORT=str(event.dport),
        ALF_SUPPRESSED=str(event.suppressed),
        **({"ALF_INTERFACE": event.interface} if event.interface else {}),  # none: queued
    )


def forward(rings: Sequence[tuple[str, str, int]], pidfd: int) -> None:
    reader = ringbuf.RingReader(
        [fd for _, _, fd in rings],
        lambda i, raw: to_journal(decode(rings[i][0], rings[i][1], raw, interface_name)),
    )
    try:
        while True:
            ready, _, _ = select.select([reader.fileno(), pidfd], [], [], 5)
            reader.consume()
            if pidfd in ready:
                return
    finally:
        reader.close()


def main(argv: Sequence[str]) -> int:
    """python3 -m alfwrapper.lifecycle.droplog SERVICE PIDFD READYFD SOCKET:FD ..."""
    service, pidfd, ready_w = argv[0], int(argv[1]), int(argv[2])
    try:
        from alfwrapper.host.companion import name_process  # noqa: PLC0415

        name_process(f"alfwrapper-log {service}")
        rings = [
            (service, spec.rsplit(":", 1)[0], int(spec.rsplit(":", 1)[1])) for spec in argv[3:]
        ]
        from systemd import journal  # noqa: F401, PLC0415  (before giving up root)

        bpf_calls.libbpf()
        from alfwrapper.lifecycle.watcher import become_watcher_user  # noqa: PLC0415

        become_watcher_user()
        os.write(ready_w, b"ready")
        os.close(ready_w)
        forward(rings, pidfd)
        return 0
    except Exception as err:  # noqa: BLE001  (a companion: one line, never a traceback)
        print(f"alfwrapper: drop log forwarder of {service}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
