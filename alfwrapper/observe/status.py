"""What a running service's firewall does: its status (text, JSON, Prometheus), the
counters per drop reason, and the drop log.  Read-only, on the pinned state
(state/) of the service's sockets, found through service.members; changing a
service is service.py's.
"""

from __future__ import annotations

import os
import struct
import sys
import time

from alfwrapper import state
from alfwrapper.bpf.parts import RUNTIME_ALLOW
from alfwrapper.errors import EX_CANTCREAT, EX_USAGE, AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.lifecycle.service import Member, collect, members, service_netns
from alfwrapper.policy.prefixes import address_text
from alfwrapper.state import alive


def counters(member: Member, pin: str = "counters") -> dict[str, int]:
    """The socket's verdict counters, summed over CPUs, by reason; ``pin`` "spa": an
    SPA socket's datagrams, by verdict (parts.SPA_VERDICTS)."""
    from alfwrapper.bpf.parts import REASONS, SPA_VERDICTS  # noqa: PLC0415
    from alfwrapper.bpf.tables import possible_cpus  # noqa: PLC0415

    cpus = possible_cpus()
    fd = state.open_pin(member.pins, pin)
    try:
        out = {}
        for i, reason in enumerate(SPA_VERDICTS if pin == "spa" else REASONS):
            raw = bpf_calls.map_lookup(fd, struct.pack("I", i), 8 * cpus) or b""
            out[reason] = sum(struct.unpack(f"{len(raw) // 8}Q", raw))
        return out
    finally:
        os.close(fd)


def spa_from(member: Member) -> float | None:
    """When the service's SPA table takes datagrams from (UTC, seconds): a table made
    by this boot's first start refuses, as stale, those sent in its first window
    (spa.c: knock_spa_since[0]).  None if there is no table."""
    from alfwrapper.bpf.parts import SPA_TABLE  # noqa: PLC0415

    try:
        fd = bpf_calls.obj_get(str(member.pins.service_dir / SPA_TABLE / "spa_since"), True)
    except OSError:
        return None
    try:
        raw = bpf_calls.map_lookup(fd, struct.pack("I", 0), 8)
    finally:
        os.close(fd)
    return struct.unpack("Q", raw)[0] / 1e9 if raw else None


def program_in_slot(member: Member) -> int:
    """The id of the program in the socket's slot (0 if empty)."""
    fd = state.open_pin(member.pins, "slot")
    try:
        raw = bpf_calls.map_lookup(fd, struct.pack("I", 0), 4)
        return struct.unpack("I", raw)[0] if raw else 0
    finally:
        os.close(fd)


def log_suppressed(member: Member) -> int | None:
    """Drop-log events suppressed by the rate limit so far, or None without a drop log."""
    from alfwrapper.bpf.parts import BUCKET  # noqa: PLC0415

    if not state.store_in_use().has_pin(member.pins, "log_bucket"):
        return None
    fd = state.open_pin(member.pins, "log_bucket")
    try:
        raw = bpf_calls.map_lookup(fd, struct.pack("I", 0), BUCKET.size)
        return int(BUCKET.unpack(raw)[3]) if raw else 0
    finally:
        os.close(fd)


def socket_status(m: Member) -> dict[str, object]:
    tree = state.store_in_use()
    counts = counters(m) if tree.has_pin(m.pins, "counters") else {}
    runtime = state.runtime_rules(m.pins) if tree.has_pin(m.pins, "runtime") else []
    pid = m.meta.get("pid")
    return {
        "name": m.name,
        "protocol": m.meta.get("protocol"),
        "address": m.meta.get("address"),
        "port": m.meta.get("port"),
        "cookie": m.pins.cookie,
        "pid": pid if alive(pid) else None,
        "rules": m.meta.get("rules", {}),
        "runtime": [
            {
                "verdict": "allow" if verdict == RUNTIME_ALLOW else "deny",
                "cidr": f"{_address(family, value)}/{length}",
            }
            for family, value, length, verdict in sorted(runtime)
        ],
        "program": program_in_slot(m),
        "counters": {
            "passed": counts.get("passed", 0),
            "dropped": {r: n for r, n in counts.items() if r != "passed"},
        },
        "log_suppressed": log_suppressed(m),
        "spa": counters(m, "spa") if tree.has_pin(m.pins, "spa") else None,
        "spa_from": spa_from(m) if tree.has_pin(m.pins, "spa") else None,
    }


def _address(family: int, value: int) -> str:
    return address_text(family, value)


# Accept=yes peers denied and reset are counted from this boot's journal (resets.py
# writes an entry for each): at most this many entries, for at most this long, so that
# a journal a flood filled cannot hold a status (or the metrics timer) for long.
RESET_ENTRIES = 1_000_000
RESET_SECONDS = 10.0


def connection_resets(service: str = "") -> dict[str, int]:
    """Resets per service (the name resets.counted_service gives) this boot; {} where
    no journal can be read (python3-systemd missing, or none kept)."""
    try:
        from systemd import journal  # noqa: PLC0415  (python3-systemd)
    except ImportError:
        return {}
    from alfwrapper.lifecycle.resets import VERDICT  # noqa: PLC0415

    counts: dict[str, int] = {}
    try:
        reader = journal.Reader()
    except OSError:
        return {}
    try:
        reader.this_boot()
        reader.add_match(ALF_VERDICT=VERDICT)
        if service:
            reader.add_match(ALF_SERVICE=service)
        deadline = time.monotonic() + RESET_SECONDS
        for read, entry in enumerate(reader, 1):
            name = str(entry.get("ALF_SERVICE", ""))
            counts[name] = counts.get(name, 0) + 1
            if read >= RESET_ENTRIES or time.monotonic() > deadline:
                print(
                    f"alfwrapper: note: counted the first {read} connection resets of "
                    f"this boot's journal only (at most {RESET_ENTRIES} or "
                    f"{RESET_SECONDS:g} s)",
                    file=sys.stderr,
                )
                break
    finally:
        reader.close()
    return counts


def status(service: str) -> dict[str, object]:
    resets = connection_resets(service)
    tree: state.Store | None = None
    try:
        collect()
        tree = state.store_in_use()
        pinned = tree.services()
    except AlfError:
        if not resets:  # nothing pinned, nothing reset: say so
            raise
        pinned = []  # an Accept=yes service's wrappers pin nothing
    names = [service] if service else sorted(set(pinned) | set(resets) - {""})
    services = []
    for name in names:
        found = None
        if tree is not None:
            try:
                found = tree.sockets_of(name)
            except AlfError:
                if name not in resets and (service or name in tree.services()):
                    raise
                # else an Accept=yes service (its resets below), or its last socket
                # closed and a gc took the folder since the listing
        if found is None or tree is None:
            if name in resets:
                services.append({"name": name, "sockets": [], "resets": resets[name]})
            continue
        sockets = [report for s in found if (report := read_socket(tree, s)) is not None]
        services.append({"name": name, "sockets": sockets, "resets": resets.get(name, 0)})
    early = early_status() if not service else []
    return {"services": services, **({"early": early} if early else {})}


def early_status() -> list[dict[str, object]]:
    """Each interface's early drop in this namespace (sets/early.py), brought up to date
    first: its sets, what each dropped, and what it judged and passed.  Root's."""
    from alfwrapper.sets import early  # noqa: PLC0415

    if not early.ROOT.is_dir():
        return []
    try:
        for line in early.refresh():
            print(f"alfwrapper: note: {line}", file=sys.stderr)
        return [
            {
                "interface": c.interface,
                "attached": c.attached,
                "dropped": c.dropped,
                "passed": c.passed,
            }
            for c in early.counts()
        ]
    except PermissionError:
        print(
            "alfwrapper: note: early drop is not shown: its state is root's (run as root)",
            file=sys.stderr,
        )
        return []


def read_socket(tree: state.Store, pins: state.SocketState) -> dict[str, object] | None:
    """A socket's status, or None if a gc took its state while it was read (the socket
    had closed): a status must not fail for what other processes do meanwhile."""
    try:
        return socket_status(Member(pins, state.read_meta(pins)))
    except AlfError:
        if tree.has_pin(pins, "meta"):
            raise
        return None


def status_lines(report: dict[str, object]) -> list[str]:
    lines = []
    for svc in report["services"]:  # type: ignore[attr-defined]
        lines.append(f"{svc['name']}:")
        for s in svc["sockets"]:
            address = str(s["address"])
            host = f"[{address}]" if ":" in address else address
            running = f"pid {s['pid']}" if s["pid"] else "not running"
            counts = s["rules"]
            rules = ", ".join(f"{n} {k}" for k, n in counts.items() if n and k != "log-drops")
            dropped = ", ".join(f"{r} {n}" for r, n in s["counters"]["dropped"].items())
            lines.append(
                f"  {s['name']} {s['protocol']} {host}:{s['port']} ({running}; program "
                f"{s['program']})"
            )
            lines.append(
                f"    rules: {rules or 'none'}; runtime rules: {len(s['runtime'])}"
                + (f"; drop log: {counts['log-drops']}/s" if counts.get("log-drops") else "")
            )
            lines.append(f"    packets passed {s['counters']['passed']}; dropped: {dropped}")
            if s["log_suppressed"] is not None:
                lines.append(f"    drop log events suppressed: {s['log_suppressed']}")
            if s.get("spa") is not None:
                spa = ", ".join(f"{v.replace('_', ' ')} {n}" for v, n in s["spa"].items())
                lines.append(f"    SPA datagrams: {spa}")
                ahead = (s.get("spa_from") or 0) - time.time()
                if ahead > 0:
                    at = time.strftime("%H:%M:%S", time.gmtime(s["spa_from"]))
                    lines.append(
                        f"    SPA: refuses datagrams as stale for {ahead:.0f} s more: "
                        f"it takes those sent from {at} UTC (the first window "
                        "after its table was made)"
                    )
        if svc.get("resets"):
            lines.append(
                f"  connections denied and reset before the command started "
                f"(Accept=yes, this boot): {svc.get('resets', 0)}"
            )
    if not report["services"]:
        lines.append("no service is pinned (nothing runs behind alfwrapper here)")
    for one in report.get("early", []):  # type: ignore[attr-defined]
        dropped = ", ".join(f"{name} {n}" for name, n in one["dropped"].items())
        state_ = "" if one["attached"] else " (detached: the interface is gone)"
        lines.append(
            f"early drop on {one['interface']}{state_}: dropped: {dropped}; "
            f"judged and passed {one['passed']}"
        )
    return lines


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(report: dict[str, object]) -> str:
    """The counters in Prometheus' text exposition format (for node_exporter's textfile
    collector)."""
    from alfwrapper import __version__  # noqa: PLC0415

    out = [
        "# HELP alfwrapper_build_info The alfwrapper that wrote these metrics.",
        "# TYPE alfwrapper_build_info gauge",
        f'alfwrapper_build_info{{version="{_label(__version__)}"}} 1',
        "# HELP alfwrapper_packets_total Packets judged by an alfwrapper socket filter "
        "(a dropped one has the reason that dropped it).",
        "# TYPE alfwrapper_packets_total counter",
    ]
    for svc in report["services"]:  # type: ignore[attr-defined]
        for s in svc["sockets"]:
            base = (
                f'service="{_label(svc["name"])}",socket="{_label(s["name"])}",'
                f'protocol="{_label(s["protocol"])}",port="{_label(s["port"])}"'
            )
            out.append(
                f'alfwrapper_packets_total{{{base},verdict="pass"}} {s["counters"]["passed"]}'
            )
            for reason, n in s["counters"]["dropped"].items():
                out.append(
                    f'alfwrapper_packets_total{{{base},verdict="drop",reason="{reason}"}} {n}'
                )
    out += [
        "# HELP alfwrapper_connections_reset_total Accept=yes connections a wrapper denied "
        "and reset before the command started, this boot (counted from the journal).",
        "# TYPE alfwrapper_connections_reset_total counter",
    ]
    for svc in report["services"]:  # type: ignore[attr-defined]
        if svc.get("resets"):
            out.append(
                f'alfwrapper_connections_reset_total{{service="{_label(svc["name"])}"}} '
                f"{svc.get('resets', 0)}"
            )
    out += [
        "# HELP alfwrapper_spa_datagrams_total Datagrams an SPA socket's filter judged, "
        "by verdict.",
        "# TYPE alfwrapper_spa_datagrams_total counter",
    ]
    for svc in report["services"]:  # type: ignore[attr-defined]
        for s in svc["sockets"]:
            for verdict, n in (s.get("spa") or {}).items():
                out.append(
                    f'alfwrapper_spa_datagrams_total{{service="{_label(svc["name"])}",'
                    f'socket="{_label(s["name"])}",port="{_label(s["port"])}",'
                    f'verdict="{verdict}"}} {n}'
                )
    out += early_metrics(report)
    out += [
        "# HELP alfwrapper_runtime_rules Runtime allow/deny rules in force on a socket.",
        "# TYPE alfwrapper_runtime_rules gauge",
    ]
    for svc in report["services"]:  # type: ignore[attr-defined]
        for s in svc["sockets"]:
            out.append(
                f'alfwrapper_runtime_rules{{service="{_label(svc["name"])}",'
                f'socket="{_label(s["name"])}",protocol="{_label(s["protocol"])}",'
                f'port="{_label(s["port"])}"}} {len(s["runtime"])}'
            )
    return "\n".join(out + crowdsec_metrics()) + "\n"


def early_metrics(report: dict[str, object]) -> list[str]:
    out = [
        "# HELP alfwrapper_early_packets_total Frames early drop judged at XDP on an "
        "interface (a dropped one has the set that held its source).",
        "# TYPE alfwrapper_early_packets_total counter",
    ]
    for one in report.get("early", []):  # type: ignore[attr-defined]
        where = f'interface="{_label(one["interface"])}"'
        out.append(f'alfwrapper_early_packets_total{{{where},verdict="pass"}} {one["passed"]}')
        for name, n in one["dropped"].items():
            out.append(
                f'alfwrapper_early_packets_total{{{where},verdict="drop",set="{_label(name)}"}} {n}'
            )
    return out


# The bouncer's counters (lifecycle/bouncer.py: Counters), as Prometheus names them.
_BOUNCER = (
    ("polls", "counter", "polls_total", "Polls of the CrowdSec LAPI's decision stream."),
    ("failures", "counter", "failures_total", "Polls that failed (the next one resyncs)."),
    ("resyncs", "counter", "resyncs_total", "Full resyncs (startup=true answers applied)."),
    ("added", "counter", "entries_added_total", "Set entries held or extended."),
    ("removed", "counter", "entries_removed_total", "Set entries removed."),
    ("skipped", "counter", "decisions_skipped_total", "Decisions not bans of an Ip or Range."),
    ("malformed", "counter", "decisions_malformed_total", "Decisions that could not be read."),
    (
        "too_wide",
        "counter",
        "decisions_too_wide_total",
        "Bans wider than widest-ipv4/-ipv6 (or /0), left out.",
    ),
    (
        "unstored",
        "gauge",
        "entries_unstored",
        "The last poll's bans the set could not take (at its most, or no memory).",
    ),
    ("entries", "gauge", "entries", "Entries the set holds for the LAPI's bans."),
    ("last_success", "gauge", "last_success_seconds", "When a poll last succeeded (Unix time)."),
    (
        "apply_seconds",
        "gauge",
        "apply_seconds",
        "Seconds from the last answer's arrival until the set held its entries.",
    ),
)


def crowdsec_metrics() -> list[str]:
    """alfwrapper_crowdsec_*, if the bouncer runs here (its metrics file)."""
    from alfwrapper.lifecycle.bouncer import read_metrics  # noqa: PLC0415

    counts = read_metrics()
    if counts is None:
        return []
    out = []
    for key, kind, name, text in _BOUNCER:
        value = counts.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out += [
                f"# HELP alfwrapper_crowdsec_{name} {text}",
                f"# TYPE alfwrapper_crowdsec_{name} {kind}",
                f"alfwrapper_crowdsec_{name} {value}",
            ]
    return out


def write_atomically(path: str, text: str) -> None:
    """For a collector that reads at any moment: a whole file or the old one."""
    folder = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}")
    try:
        with open(temp, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except OSError as err:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise AlfError(
            f"writing {path}",
            err.strerror or str(err),
            "name a file in a folder that exists and that you may write to",
            EX_CANTCREAT,
        ) from None


def log(service: str, follow: bool, as_json: bool) -> int:
    """Print the drop log of a service (every service, if "")."""
    from alfwrapper.lifecycle import droplog  # noqa: PLC0415

    tree = state.store_in_use()
    everyone = [service] if service else tree.services()
    found = [m for name in everyone for m in members(name) if tree.has_pin(m.pins, "events")]
    if not found:
        raise AlfError(
            f"service {service}" if service else "alfwrapper log",
            "logs no drops" if service else "no service logs drops",
            "start it (or reload it) with --log-drops RATE, or log-drops = RATE in its policy",
            EX_USAGE,
        )
    for name in sorted({m.pins.service for m in found}):
        if any(alive(m.meta.get("forwarder")) for m in found if m.pins.service == name):
            print(
                f"note: {name}'s drops go to the journal: journalctl ALF_SERVICE={name}",
                file=sys.stderr,
            )
    rings = [(m.pins.service, m.name, state.open_pin(m.pins, "events")) for m in found]
    pids = [m.meta.get("pid") for m in found]
    app = next((p for p in pids if isinstance(p, int) and alive(p)), 0)
    netns = {m.meta.get("netns") for m in found}
    try:
        # Interface indexes mean the service's network namespace: named there, or
        # given by index when the services' namespaces differ or cannot be entered.
        with service_netns(service, netns.pop(), app, strict=False) as there:
            naming = droplog.interface_name if there and not netns else None
            droplog.read(rings, droplog.print_event(as_json), follow, naming)
    except KeyboardInterrupt:
        pass
    finally:
        for _, _, fd in rings:
            os.close(fd)
    return 0
