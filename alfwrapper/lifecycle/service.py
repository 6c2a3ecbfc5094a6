"""A running service's firewall, changed in place: reload, live allow/deny/revoke, show, gc.
(What it does, read only, is observe/status.py's: status, metrics, the drop log.)

Everything here works on the pinned state (state/) of the service's sockets,
while the application keeps running: a reload puts new programs into the
sockets' slots (one atomic update each), and runtime rules are entries of
each socket's runtime map, in force from the next packet.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from alfwrapper import state
from alfwrapper.bpf import program
from alfwrapper.bpf.parts import RUNTIME_ALLOW, RUNTIME_DENY, FillEnv, knock_folders
from alfwrapper.errors import EX_CONFIG, EX_NOPERM, EX_USAGE, AlfError, excerpt
from alfwrapper.host import activation
from alfwrapper.host.faults import crash_point
from alfwrapper.host.netns import netns as enter_netns
from alfwrapper.lifecycle import companions, cut
from alfwrapper.policy.files import SPA_SUFFIX, Policy
from alfwrapper.policy.prefixes import Prefix, parse_cidrs
from alfwrapper.policy.rules import SocketRules, check_service
from alfwrapper.record import Record
from alfwrapper.state import alive

if TYPE_CHECKING:
    from alfwrapper.bpf.compiler import LoadedFilter


class Member(Record, frozen=False):
    """One socket of a running service, as its pinned state describes it."""

    pins: state.SocketState  # where its pinned state is
    meta: dict[str, object]
    # A gone socket whose state gc keeps for its runtime rules, until a socket of its
    # name holds them (state.inherit_runtime); allow, deny and revoke change them too.
    gone: bool = False

    @property
    def name(self) -> str:
        return str(self.meta.get("name", "unknown"))

    def program_label(self) -> str:
        """Its programs' and maps' name, as the wrapper gave it (program.label)."""
        port = self.meta.get("port", 0)
        protocol = str(self.meta.get("protocol", ""))
        return program.label(self.pins.service, protocol, port if isinstance(port, int) else 0)

    def title(self) -> str:
        """How messages name it: name (protocol address:port)."""
        address = str(self.meta.get("address", "?"))
        host = f"[{address}]" if ":" in address else address
        where = f"{self.meta.get('protocol', '?')} {host}:{self.meta.get('port', '?')}"
        return f"{self.name} ({where}" + (
            ", gone: its runtime rules wait for its next start)" if self.gone else ")"
        )


def collect() -> tuple[list[state.SocketState], str]:
    """Forget sockets that are gone: in every network namespace when we may enter them
    (root), else in this one.  Returns what was removed, and where we looked."""
    return state.store_in_use().collect()


def members(service: str, name: str = "", gone: bool = True) -> list[Member]:
    """The service's sockets (those named ``name``, if given): the live ones, and unless
    not ``gone`` those gone whose runtime rules gc keeps."""
    collect()
    found = [Member(s, state.read_meta(s)) for s in state.store_in_use().sockets_of(service)]
    live = functools.cache(lambda: state.live_everywhere(strict=False))
    for m in found:  # as gc judges them (state/collection.py)
        m.gone = (
            not alive(m.meta.get("pid"))
            and m.meta.get("netns") in live()[1]
            and m.pins.cookie not in live()[0]
        )
    if not gone:
        found = [m for m in found if not m.gone]
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
        return check_service(given)
    unit = activation.unit_of_this_process()
    if not unit:
        raise AlfError(
            "service",
            "none given, and this process runs in no systemd service",
            "name the service: alfwrapper reload SERVICE",
            EX_USAGE,
        )
    return check_service(unit)


def check_spa_sockets(service: str, found: list[Member], rules: dict[int, SocketRules]) -> None:
    """A reload keeps the SPA sockets a start made (it makes and closes no socket): each
    socket that would take SPA datagrams has one, each SPA socket stays one, and one the
    wrapper made keeps the port the new rules give it."""
    named = {m.name: m for m in found}
    for m in found:
        knock = rules[id(m)].knock
        door = knock is not None and knock.spa and not knock.verifier
        spa = named.get(m.name + SPA_SUFFIX)
        if door and spa is None:
            raise AlfError(
                f"reloading {service}",
                f"socket {m.title()} would take SPA datagrams, and has no SPA socket (a start "
                "makes it)",
                "nothing was changed; restart the service to make it",
                EX_USAGE,
            )
        if door and spa is not None and spa.meta.get("made"):
            assert knock is not None
            # At --knock-spa-port, or the port of the first socket of its name.
            wanted = (
                {knock.spa_port}
                if knock.spa_port
                else {f.meta.get("port") for f in found if f.name == m.name}
            )
            if spa.meta.get("port") not in wanted:
                raise AlfError(
                    f"reloading {service}",
                    f"the SPA socket {spa.title()} would move to udp port "
                    f"{knock.spa_port or 'of ' + m.name}",
                    "nothing was changed; restart the service to move it",
                    EX_USAGE,
                )
        if m.name.endswith(SPA_SUFFIX) and not (knock is not None and knock.verifier):
            raise AlfError(
                f"reloading {service}",
                f"the SPA socket {m.title()} would take no SPA datagrams (no knock-spa for "
                f"{m.name[: -len(SPA_SUFFIX)]}), and deliver what it is sent",
                "nothing was changed; restart the service without it (one a socket unit "
                "passes: remove it from the unit first)",
                EX_USAGE,
            )


def reload(
    service: str, argv: list[str] | None, build: Callable[[list[str]], Policy]
) -> list[Member]:
    """Put the service's policy, built anew from ``argv`` (or the argv it was started
    with), into every socket's slot.  Returns the sockets."""
    found = members(service, gone=False)
    for m in found:  # what is read is checked before anything is changed
        problem = state.store_in_use().check_pins(m.pins)
        if problem:
            raise AlfError(
                f"reloading {service}",
                f"the pinned state of socket {m.title()} is damaged: {problem}",
                "nothing was changed; restart the service's socket unit",
                EX_CONFIG,
            )
    options = argv if argv is not None else stored_options(service, found)
    cwd = str(found[0].meta.get("cwd", "/"))
    state.check_meta_room(options, os.getcwd() if argv is not None else cwd)
    here = os.getcwd()
    try:
        if argv is None and os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths in the stored options meant that folder
        policy = build(options)
    finally:
        os.chdir(here)
    names = [m.name for m in found]
    if any(m.meta.get("intercepted") for m in found):
        from alfwrapper.lifecycle import intercept  # noqa: PLC0415

        intercept.check(policy)  # the daemon's sockets come as it binds them
        names += sorted(policy.names)
    policy.check_names(names)
    rules = {id(m): policy.rules_for(m.name) for m in found}
    check_spa_sockets(service, found, rules)
    pids = [int(str(m.meta.get("pid", 0)) or 0) for m in found]
    app = next((p for p in pids if alive(p)), 0)
    # Interface names and indexes mean the service's network namespace: its watcher
    # follows renames there, and its drop log forwarder names interfaces there.
    from alfwrapper.lifecycle.kept import refresh_early  # noqa: PLC0415

    with service_netns(service, found[0].meta.get("netns"), app):
        loaded, watcher = load_members(service, found, rules, app)
        crash_point("reload-loaded")
        # Early drop stops dropping for the sets the new programs no longer deny before
        # they are in force, and starts on the new ones after (below).
        refresh_early({m.pins.cookie: rules[id(m)].deny_sets for m in found})
        for m in found:
            state.store_in_use().install(m.pins, loaded[id(m)].fd)
            crash_point("reload-installed")
        old_watchers = {int(str(m.meta.get("watcher", 0)) or 0) for m in found} - {0, watcher}
        for pid in old_watchers:
            try:
                os.kill(pid, signal.SIGTERM)  # its programs are out of every slot now
            except OSError:
                pass
        from alfwrapper.bpf import compiler  # noqa: PLC0415

        forwarder = 0
        wanted_log = any(rules[id(m)].log_rate for m in found)
        running = {m.meta.get("forwarder") for m in found} - {None, 0}
        if wanted_log and app and not any(alive(p) for p in running):
            logging = [(m.name, m.pins) for m in found if rules[id(m)].log_rate]
            forwarder = companions.start_forwarder(logging, service, app)
        else:
            forwarder = next((int(str(p)) for p in running if alive(p)), 0)
    reload_id = os.urandom(8).hex()  # a bind supervisor builds the policy again by it
    for m in found:
        m.meta.update(
            reload=reload_id,
            argv=options,
            watcher=watcher,
            forwarder=forwarder,
            rules=rules[id(m)].counts(),
            guards=rules[id(m)].guards(),
            fingerprint=rules[id(m)].fingerprint(),
            reloaded=int(time.time()),
            program=compiler.prog_id(loaded[id(m)]),
            knock=knock_folders(rules[id(m)]),
            deny_sets=list(rules[id(m)].deny_sets),
        )
        if argv is not None:
            m.meta["cwd"] = here
        state.write_meta(m.pins, m.meta)
    with service_netns(service, found[0].meta.get("netns"), app, strict=False):
        refresh_early()
    collect()  # knock state no socket uses any more
    return found


def stored_options(service: str, found: list[Member]) -> list[str]:
    """The rule options the service was started with, as its sockets' meta keep them:
    the same list in every socket's meta, or the reload is refused (a rule-less program
    must never come of a meta that is damaged, cut short or someone else's)."""
    kept = [m.meta.get("argv") for m in found]
    first = kept[0]
    if not (
        isinstance(first, list)
        and all(isinstance(a, str) for a in first)
        and all(k == first for k in kept)
        and all(m.meta.get("service") == service for m in found)
    ):
        raise AlfError(
            f"reloading {service}",
            "the options it was started with are not in its pinned state (damaged, cut "
            "short, or not alfwrapper's)",
            "nothing was changed; give the rule options (alfwrapper reload SERVICE "
            "--policy NAME ...), or restart the service",
            EX_CONFIG,
        )
    return list(first)


def load_members(
    service: str, found: list[Member], rules: dict[int, SocketRules], app: int
) -> tuple[dict[int, LoadedFilter], int]:
    """Each socket's new program (by id(member)), and the pid of the interface watcher
    that holds them, if they need one."""
    from alfwrapper import sets  # noqa: PLC0415

    env = sets.fill_env(FillEnv.of_host(rules.values()), rules.values())
    loaded = {
        id(m): state.store_in_use().load_filter(
            rules[id(m)],
            m.pins,
            m.program_label(),
            [m.pins.cookie] if rules[id(m)].knock and m.meta.get("protocol") == "tcp" else [],
            env=env,
        )
        for m in found
    }
    following = [lf for lf in loaded.values() if lf.plan.rules.interfaces]
    if following and app:
        return loaded, companions.start_watcher(following, service, app)
    return loaded, 0


@contextmanager
def service_netns(service: str, netns: object, app: int, strict: bool = True) -> Iterator[bool]:
    """Run the block in the service's network namespace (that of its application),
    when it is not ours: a reload from the host of a service in a container or with
    PrivateNetwork=.  Yields whether the block runs there; unless ``strict``, it
    runs where we are when it cannot."""
    if not netns or netns == state.netns_cookie():
        yield True
        return
    if not strict and (not app or os.geteuid() != 0):
        yield False
        return
    if not app:
        raise AlfError(
            f"reloading {service}",
            "it runs in another network namespace, and its application is not running",
            "run the reload inside that namespace (ExecReload= does)",
            EX_USAGE,
        )
    with ExitStack() as inside:
        try:
            inside.enter_context(enter_netns(f"/proc/{app}/ns/net"))
        except PermissionError:
            raise AlfError(
                f"reloading {service}",
                f"it runs in the network namespace of pid {app}, which only root may enter",
                f"run as root, or inside it: nsenter -t {app} -n alfwrapper reload {service}",
                EX_NOPERM,
            ) from None
        yield True


VERDICTS = {"allow": RUNTIME_ALLOW, "deny": RUNTIME_DENY, "revoke": None}


def change(
    service: str, name: str, verb: str, cidrs: Sequence[str], every: bool = False
) -> list[str]:
    """allow, deny or revoke CIDRs on the service's sockets (the gone ones whose rules
    wait for the next start too), at once; one line per change.  ``every``: revoke
    every rule (revoke --all)."""
    if every:
        return flush(service, name)
    prefixes = parse_cidrs(cidrs)
    verdict = VERDICTS[verb]
    lines = []
    found = members(service, name)
    for m in found:
        for prefix in prefixes:
            key = state.runtime_key(prefix.family, prefix.value, prefix.length)
            changed = state.set_runtime(m.pins, key, verdict)
            what = "revoked" if verdict is None else f"{verb} rule for"
            if verdict is None and not changed:
                lines.append(f"{service} {m.title()}: no runtime rule for {prefix} to revoke")
            else:
                lines.append(f"{service} {m.title()}: {what} {prefix}")
    if verdict == RUNTIME_DENY:  # in force: now its live connections (lifecycle/cut.py)
        lines += cut_denied(service, found, prefixes)
    return lines


def cut_denied(service: str, found: Sequence[Member], prefixes: Sequence[Prefix]) -> list[str]:
    """Reset the TCP connections from ``prefixes`` to these sockets that their runtime
    rules now deny; what could not be reset is said on stderr."""
    targets = []
    for m in found:
        if m.gone:
            continue
        rules = tuple(state.runtime_rules(m.pins))
        target = cut.target_of(m.meta, f"{service} {m.title()}", rules)
        targets += [target] if target is not None else []
    report = cut.cut(targets, prefixes, f"the deny rule for {', '.join(map(str, prefixes))}")
    cut.say_problems(report)
    return report.done


def flush(service: str, name: str) -> list[str]:
    """Revoke every runtime rule of the service's sockets (named ``name``, if given)."""
    lines, tree = [], state.store_in_use()
    for m in members(service, name):
        rules = state.runtime_rules(m.pins) if tree.has_pin(m.pins, "runtime") else []
        for family, value, length, _ in rules:
            state.set_runtime(m.pins, state.runtime_key(family, value, length), None)
        lines.append(f"{service} {m.title()}: revoked {len(rules)} runtime rule(s)")
    collect()  # a gone socket's state, kept for its rules alone
    return lines


def runtime_rule_count(found: Sequence[Member]) -> int:
    """How many runtime rules these sockets hold, together."""
    tree = state.store_in_use()
    return sum(len(state.runtime_rules(m.pins)) for m in found if tree.has_pin(m.pins, "runtime"))


def show(service: str) -> list[str]:
    lines, tree = [], state.store_in_use()
    for m in members(service):
        rules = state.runtime_rules(m.pins) if tree.has_pin(m.pins, "runtime") else []
        lines.append(f"{service} {m.title()}: {len(rules)} runtime rule(s)")
        for family, value, length, verdict in sorted(rules):
            kind = "allow" if verdict == RUNTIME_ALLOW else "deny"
            lines.append(f"  {kind} {Prefix(family, value, length)}")
    return lines


def gc() -> list[str]:
    """Remove the state of sockets that are gone, what a killed `set create` left
    (sets.collect_unfinished), and program cache entries beyond the cache's bounds or
    not used for a month."""
    from alfwrapper.bpf import cache  # noqa: PLC0415

    removed, scope = collect()
    lines = [f"removed {s.service} sock-{s.cookie}" for s in removed]
    lines.append(f"gc: {len(removed)} stale socket state(s) removed, in {scope}")
    if state.store_in_use().opens_sets:  # the host's sets (root's), not through the loader
        from alfwrapper import sets  # noqa: PLC0415

        unfinished = sets.collect_unfinished()
        if unfinished:
            lines.append(
                f"gc: {len(unfinished)} unfinished set folder(s) removed "
                f"({', '.join(unfinished)}), in {sets.root()}"
            )
        from alfwrapper.sets import early  # noqa: PLC0415

        gone = early.collect()
        if gone:
            lines.append(
                f"gc: early drop of {len(gone)} interface(s) that are gone removed "
                f"({', '.join(gone)}), in {early.ROOT}"
            )
    folder = cache.directory()
    if folder is not None:
        pruned = cache.prune(folder, unused_for=cache.GC_UNUSED_SECONDS)
        lines.append(
            f"gc: {pruned} program cache entr{'y' if pruned == 1 else 'ies'} removed, in {folder}"
        )
    return lines


def out(lines: Sequence[str]) -> int:
    for line in lines:
        print(line, file=sys.stdout)
    return 0
