"""A running service's firewall, changed in place: reload, live allow/deny/revoke, show, gc.

Everything here works on the pinned state (state.py) of the service's sockets,
while the application keeps running: a reload puts new programs into the
sockets' slots (one atomic update each), and runtime rules are entries of
each socket's runtime map, in force from the next packet.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from alfwrapper import interfaces, state
from alfwrapper.errors import EX_USAGE, AlfError, excerpt
from alfwrapper.parts import RUNTIME_ALLOW, RUNTIME_DENY, FillEnv, knock_key
from alfwrapper.policy import Policy
from alfwrapper.rules import Prefix, parse_prefix


@dataclass
class Member:
    """One socket of a running service, as its pinned state describes it."""

    state: state.SocketState
    meta: dict[str, object]

    @property
    def name(self) -> str:
        return str(self.meta.get("name", "unknown"))

    def label(self) -> str:
        address = str(self.meta.get("address", "?"))
        host = f"[{address}]" if ":" in address else address
        return f"{self.name} ({self.meta.get('protocol', '?')} {host}:{self.meta.get('port', '?')})"


def collect() -> tuple[list[state.SocketState], str]:
    """Forget sockets that are gone: in every network namespace when we may enter them
    (root), else in this one.  Returns what was removed, and where we looked."""
    try:
        return state.gc_everywhere(), "every network namespace"
    except OSError:
        return state.gc(), "this network namespace (run as root for all)"


def members(service: str, name: str = "") -> list[Member]:
    """The service's live sockets (those named ``name``, if given)."""
    collect()
    found = [Member(s, state.read_meta(s)) for s in state.sockets_of(service)]
    if name:
        chosen = [m for m in found if m.name == name]
        if not chosen:
            names = ", ".join(sorted({m.name for m in found})) or "none"
            raise AlfError(
                f"--socket {excerpt(name)}",
                f"service {service} has no socket of that name",
                f"its sockets: {names}",
                EX_USAGE,
            )
        return chosen
    if not found:
        raise AlfError(f"service {service}", "has no sockets left", "is it running?", EX_USAGE)
    return found


def default_service(given: str) -> str:
    """The SERVICE argument, else the systemd unit we run in (ExecReload=)."""
    if given:
        return state.check_service(given)
    unit = state.unit_of_this_process()
    if not unit:
        raise AlfError(
            "service",
            "none given, and this process runs in no systemd service",
            "name the service: alfwrapper reload SERVICE",
            EX_USAGE,
        )
    return state.check_service(unit)


def reload(
    service: str, argv: list[str] | None, build: Callable[[list[str]], Policy]
) -> list[Member]:
    """Put the service's policy, built anew from ``argv`` (or the argv it was started
    with), into every socket's slot.  Returns the sockets."""
    from alfwrapper import wrapper  # noqa: PLC0415  (BCC only where programs load)

    found = members(service)
    stored = found[0].meta.get("argv")
    options = argv if argv is not None else list(stored) if isinstance(stored, list) else []
    cwd = str(found[0].meta.get("cwd", "/"))
    here = os.getcwd()
    try:
        if argv is None and os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths in the stored options meant that folder
        policy = build(options)
    finally:
        os.chdir(here)
    wrapper.check_names(policy, [m.name for m in found])
    rules = {id(m): policy.rules_for(m.name) for m in found}
    wanted = sorted({i for r in rules.values() for i in r.interfaces})
    indexes = interfaces.resolve(wanted) if wanted else {}
    env = FillEnv({i: n for n, i in indexes.items()}, interfaces.link_index)
    loaded = {id(m): wrapper.load_pinned(rules[id(m)], m.state, env) for m in found}
    for m in found:
        lf = loaded[id(m)]
        if lf.plan.rules.knock and m.meta.get("protocol") == "tcp":
            from alfwrapper import compiler  # noqa: PLC0415

            compiler.set_knock_listeners(lf.bpf, [m.state.cookie])
    pids = [int(str(m.meta.get("pid", 0)) or 0) for m in found]
    app = next((p for p in pids if p and os.path.exists(f"/proc/{p}")), 0)
    watcher = 0
    following = [lf for lf in loaded.values() if lf.plan.rules.interfaces]
    if following and app and os.path.exists(f"/proc/{app}"):
        watcher = wrapper.start_watcher(following, service, app)
    for m in found:
        state.clear_runtime(m.state)  # runtime rules last until the next reload
        state.install(m.state, loaded[id(m)].fd)
    old_watchers = {int(str(m.meta.get("watcher", 0)) or 0) for m in found} - {0, watcher}
    for pid in old_watchers:
        try:
            os.kill(pid, signal.SIGTERM)  # its programs are out of every slot now
        except OSError:
            pass
    from alfwrapper import compiler  # noqa: PLC0415

    for m in found:
        m.meta.update(
            argv=options,
            watcher=watcher,
            reloaded=int(time.time()),
            program=compiler.prog_id(loaded[id(m)]),
            knock=knock_key(rules[id(m)]) if rules[id(m)].knock else "",
        )
        if argv is not None:
            m.meta["cwd"] = here
        state.write_meta(m.state, m.meta)
    collect()  # knock state no socket uses any more
    return found


def parse_cidrs(texts: Sequence[str]) -> list[Prefix]:
    out = []
    for text in texts:
        try:
            out.append(parse_prefix(text))
        except ValueError as err:
            raise AlfError(
                "CIDR", str(err), "give a CIDR such as 198.51.100.7 or 2001:db8::/48", EX_USAGE
            ) from None
    return out


VERDICTS = {"allow": RUNTIME_ALLOW, "deny": RUNTIME_DENY, "revoke": None}


def change(service: str, name: str, verb: str, cidrs: Sequence[str]) -> list[str]:
    """allow, deny or revoke CIDRs on the service's sockets, at once; one line per change."""
    prefixes = parse_cidrs(cidrs)
    verdict = VERDICTS[verb]
    lines = []
    for m in members(service, name):
        for prefix in prefixes:
            key = state.runtime_key(prefix.family, prefix.value, prefix.length)
            changed = state.set_runtime(m.state, key, verdict)
            what = "revoked" if verdict is None else f"{verb} rule for"
            if verdict is None and not changed:
                lines.append(f"{service} {m.label()}: no runtime rule for {prefix} to revoke")
            else:
                lines.append(f"{service} {m.label()}: {what} {prefix}")
    return lines


def show(service: str) -> list[str]:
    lines = []
    for m in members(service):
        rules = state.runtime_rules(m.state) if (m.state.dir / "runtime").exists() else []
        lines.append(f"{service} {m.label()}: {len(rules)} runtime rule(s)")
        for family, value, length, verdict in sorted(rules):
            af = socket.AF_INET if family == 4 else socket.AF_INET6
            raw = value.to_bytes(4 if family == 4 else 16, "big")
            kind = "allow" if verdict == RUNTIME_ALLOW else "deny"
            lines.append(f"  {kind} {socket.inet_ntop(af, raw)}/{length}")
    return lines


def gc() -> list[str]:
    """Remove the state of sockets that are gone."""
    removed, scope = collect()
    lines = [f"removed {s.service} sock-{s.cookie}" for s in removed]
    lines.append(f"gc: {len(removed)} stale socket state(s) removed, in {scope}")
    return lines


def out(lines: Sequence[str]) -> int:
    for line in lines:
        print(line, file=sys.stdout)
    return 0
