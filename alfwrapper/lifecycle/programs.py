"""Each socket record's filter: its pinned state taken, its program loaded and filled,
then installed."""

from __future__ import annotations

from alfwrapper import state
from alfwrapper.bpf import program
from alfwrapper.bpf.compiler import LoadedFilter
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.host import attach
from alfwrapper.host.faults import crash_point
from alfwrapper.lifecycle.sockets import SocketRecord
from alfwrapper.policy.rules import SocketRules


def filter_sockets(records: list[SocketRecord], service: str, pinned: bool) -> list[LoadedFilter]:
    """Each socket's filter, in three phases with a crash point after each: every kept
    socket taken by its pinned dispatcher (state.Store.take: found again by its cookie
    or made; only if ``pinned``), then the programs loaded and filled, then put into the
    slots (atomically), or, where no state is kept, onto the sockets.  Returns the
    programs: one for each socket with pinned state (its maps are its own), and one
    per distinct rule set for the others (every socket when no state can be kept).
    A connected Accept=yes socket lives as long as its one connection: no state and
    no program (its rules judge its one peer: backlog.judge_connection)."""
    kept = [r for r in records if not r.connected]
    for record in kept:
        port = record.spec.port if record.spec else record.sock.getsockname()[1]
        record.label = program.label(service, record.protocol, port)
    for record in kept if pinned else []:
        taken = state.store_in_use().take(service, record.sock, record.label)
        record.pins, record.judged, record.made = taken.state, taken.judged, taken.made

    from alfwrapper import sets  # noqa: PLC0415

    env = sets.fill_env(FillEnv.of_host(r.rules for r in kept), [r.rules for r in kept])
    shared: dict[SocketRules, LoadedFilter] = {}
    loaded: list[LoadedFilter] = []
    for record in kept:
        # The knock part tells a listener's handshake from an accepted connection's
        # traffic by the socket's cookie: it must know its listeners (those sharing
        # the program) before any packet reaches them.
        if record.pins is not None:
            sharing = [record]
        elif record.rules.empty or record.rules in shared:
            record.loaded = shared.get(record.rules)
            continue
        else:
            sharing = [r for r in kept if r.pins is None and r.rules == record.rules]
        cookies = [attach.socket_cookie(r.sock) for r in sharing if r.listener and r.rules.knock]
        record.loaded = state.store_in_use().load_filter(
            record.rules,
            record.pins,
            record.label,
            cookies,
            None if record.pins is not None else record.sock,
            env,
        )
        loaded.append(record.loaded)
        if record.pins is None:
            shared[record.rules] = record.loaded
    crash_point("loaded")

    for record in kept:
        if record.pins is not None:
            assert record.loaded is not None
            state.inherit_runtime(record.pins, record.name)  # before a packet meets it
            state.store_in_use().install(record.pins, record.loaded.fd)
        elif record.loaded is not None:
            attach.attach_filter(record.sock, record.loaded.fd)
    crash_point("installed")
    return loaded
