"""Check a policy without starting anything: parse it, build, compile and load every
program it implies (nothing is attached), print a summary per socket, and warn about
rules that can never match.  Exit 0 when the wrapper would start; otherwise the same
one-line error and exit code the wrapper would give.  Without CAP_BPF the loader
loads the programs, as it does for a start; if it does not answer, everything else
is checked and a warning says what was not."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.errors import EX_CONFIG, EX_UNAVAILABLE, AlfError
from alfwrapper.host import bpf_calls, interfaces
from alfwrapper.policy.files import SPA_SUFFIX, Policy
from alfwrapper.policy.prefixes import FAMILY_BITS, Prefix
from alfwrapper.policy.rules import ListenSpec, SocketRules
from alfwrapper.record import Record


class Checked(Record):
    """A program check loaded (here, or by the loader): its fd, parts and maps' size."""

    fd: int
    parts: tuple[str, ...]
    map_bytes: int


class Target(Record):
    """A socket the policy gives rules to: created, named by --names, or any other."""

    name: str | None  # None: a socket with no rules of its own name
    spec: ListenSpec | None = None

    @property
    def title(self) -> str:
        if self.name is None:
            return "any other socket"
        return f"socket {self.name}" + (f" ({self.spec})" if self.spec else "")


def targets(policy: Policy, names: Sequence[str]) -> list[Target]:
    found = [Target(spec.name, spec) for spec in policy.listens]
    known = {t.name for t in found}
    for name in [*names, *sorted(policy.names)]:
        if name not in known:
            found.append(Target(name))
            known.add(name)
    if not policy.listens:
        found.append(Target(None))
    # Each SPA socket a start would make or take, checked as its program (the one that
    # checks datagrams) would load.
    for target in list(found):
        knock = policy.rules_for(target.name or "").knock
        if knock is not None and knock.spa:
            found.append(Target(f"{target.name or 'unknown'}{SPA_SUFFIX}"))
    return found


def _socket_families(spec: ListenSpec) -> set[int]:
    if spec.host == "::":
        return {4, 6}
    if spec.host.startswith("::ffff:") and "." in spec.host:
        return {4}
    return {spec.family}


def _where(rules: SocketRules, kind: str, prefix: Prefix) -> str:
    for source in rules.sources:
        if source.kind == kind and prefix in source.prefixes:
            return f" ({source.origin})"
    return ""


def warnings_for(policy: Policy, target: Target, rules: SocketRules) -> list[str]:  # noqa: C901
    """Rules that can never match on this socket."""
    out: list[str] = []
    title = target.title
    allow, deny = rules.subnets.allow, rules.subnets.deny
    if target.spec is not None:
        families = _socket_families(target.spec)
        for kind, prefixes in (("allow", allow), ("deny", deny)):
            foreign = [p for p in prefixes if p.family not in families]
            if foreign:
                out.append(
                    f"{title}: {len(foreign)} {kind} rule(s) for IPv{foreign[0].family} "
                    f"(such as {foreign[0]}{_where(rules, kind, foreign[0])}) can never "
                    f"match: the socket receives IPv{min(families)} only"
                )
        if allow and not any(p.family in families for p in allow):
            out.append(
                f"{title}: no allow rule is for a family the socket receives: it drops everything"
            )
    deny_set = set(deny)
    for p in [p for p in allow if p in deny_set][:3]:
        out.append(
            f"{p} is both allowed{_where(rules, 'allow', p)} and denied"
            f"{_where(rules, 'deny', p)}: the deny wins"
        )
    deny_lengths: dict[int, set[int]] = {}
    for d in deny:
        deny_lengths.setdefault(d.family, set()).add(d.length)
    hidden = []
    for a in allow:
        if a in deny_set:
            continue
        width = FAMILY_BITS[a.family]
        for length in sorted(deny_lengths.get(a.family, ())):
            if length <= a.length:
                shift = width - length
                covering = Prefix(a.family, a.value >> shift << shift, length)
                if covering in deny_set:
                    hidden.append((a, covering))
                    break
    for a, d in hidden[:3]:
        out.append(
            f"allow {a}{_where(rules, 'allow', a)} can never match: deny "
            f"{d}{_where(rules, 'deny', d)} covers it"
        )
    if len(hidden) > 3:
        out.append(f"{len(hidden) - 3} more allow rules are hidden by deny rules")
    return out


def policy_warnings(policy: Policy, found: list[Target], names: Sequence[str]) -> list[str]:
    out = []
    known = {spec.name for spec in policy.listens} | set(names)
    if known:  # what sockets there will be is known only if some are named
        for name in sorted(policy.names - known):
            out.append(
                f"{policy.origin_of_name(name)}: rules for {name}: no socket has that name "
                "(the wrapper refuses this unless an inherited socket is named so)"
            )
    for scope, rules in policy.scopes:
        given = [(k, o) for k, o in rules.origins if k.startswith("knock-") and k != "knock-secret"]
        if not given:
            continue
        applies = [scope] if scope else [t.name for t in found]
        if not any(policy.rules_for(n or "").knock for n in applies):
            key, origin = given[0]
            out.append(f"{origin}: {key} has no effect: no knock rule applies there")
            continue
        statics = [n for n in applies if (k := policy.rules_for(n or "").knock) and not k.secret]
        for key, origin in given:
            if key in ("knock-window", "knock-steps") and statics:
                out.append(
                    f"{origin}: {key} has no effect on a static --knock sequence "
                    "(it is for --knock-secret)"
                )
    return out


def summary(
    target: Target, rules: SocketRules, loaded: Checked | None, planned: bool = False
) -> dict[str, Any]:
    """A socket's summary; ``planned``: its program was planned but not loaded."""
    counts = {
        "allow": len(rules.subnets.allow),
        "deny": len(rules.subnets.deny),
        "interfaces": len(rules.interfaces),
        "knock": _knock_kind(rules),
        "filter": rules.custom.path if rules.custom else None,
        "set": len(rules.custom.sets) if rules.custom else 0,
        "allow_sets": list(rules.allow_sets),
        "deny_sets": list(rules.deny_sets),
    }
    out: dict[str, Any] = {
        "name": target.name,
        "address": str(target.spec) if target.spec else None,
        "rules": counts,
        "filtered": loaded is not None or planned,
        "loaded": loaded is not None,
    }
    if loaded is not None:
        out["parts"] = list(loaded.parts)
        out["instructions"] = bpf_calls.prog_info(loaded.fd).instructions
        out["map_bytes"] = loaded.map_bytes
    return out


def _knock_kind(rules: SocketRules) -> str | None:
    """How the socket knocks: static or secret sequences, "spa" (an SPA datagram opens
    it), or "spa socket" (it checks the datagrams)."""
    knock = rules.knock
    if knock is None:
        return None
    if knock.spa:
        return "spa socket" if knock.verifier else "spa"
    return "secret" if knock.secret else "static"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _line(target: Target, s: dict[str, Any]) -> str:
    r = s["rules"]
    kinds = [f"{r[k]} {k}" for k in ("allow", "deny") if r[k]]
    kinds += [f"{kind}-set {name}" for kind in ("allow", "deny") for name in r[f"{kind}_sets"]]
    if r["interfaces"]:
        kinds.append(f"{r['interfaces']} interface(s)")
    if r["knock"]:
        kinds.append(f"knocking ({r['knock']})")
    if r["filter"]:
        kinds.append(f"filter {r['filter']} ({r['set']} --set)")
    if not s["filtered"]:
        return f"{target.title}: no rules, not filtered"
    if not s["loaded"]:
        return f"{target.title}: {', '.join(kinds)}; program not loaded"
    return (
        f"{target.title}: {', '.join(kinds)}; program of {s['instructions']} instructions, "
        f"maps {_size(s['map_bytes'])}"
    )


def _loader() -> Any:
    """The loader's client, when this process may not load programs itself (no CAP_BPF
    where unprivileged BPF is disabled): the wrapper's own choice (client.needed)."""
    from alfwrapper import state  # noqa: PLC0415
    from alfwrapper.loader import client  # noqa: PLC0415

    return state.store_in_use() if client.use_if_needed() else None


def _load(
    plan: program.ProgramPlan, env: FillEnv, broker: Any, kept: list[object]
) -> tuple[Checked, str]:
    """Load the plan's program, here (kept in ``kept``: BCC's module owns its fds) or by
    the loader; with the warning a program the verifier passes only with more than
    CAP_BPF gets."""
    if broker is not None:
        fd, map_bytes = broker.check(plan.rules, "check")
        return Checked(fd, tuple(plan.part_names), map_bytes), ""
    loaded = compiler.load_program(plan, env)
    kept.append(loaded)
    maps = loaded.tables.fds().values()
    size = sum(bpf_calls.fd_memlock(fd) for fd in maps)
    checked = Checked(loaded.fd, tuple(plan.part_names), size)
    return checked, compiler.refused_without_perfmon(loaded)


def main(  # noqa: C901
    policy: Policy, names: Sequence[str], strict: bool, as_json: bool, print_filter: bool
) -> int:
    found = targets(policy, names)
    wanted = sorted({i for t in found for i in policy.rules_for(t.name or "").interfaces})
    indexes = interfaces.resolve(wanted) if wanted else {}
    env = FillEnv({i: n for n, i in indexes.items()}, interfaces.link_index)
    broker = _loader()
    named_sets = any(
        r.allow_sets or r.deny_sets for r in (policy.rules_for(t.name or "") for t in found)
    )
    if named_sets and broker is None:  # the loader opens root's sets itself
        from alfwrapper import sets  # noqa: PLC0415

        env = sets.check_env(env)
    loaded: dict[SocketRules, Checked] = {}
    kept: list[object] = []  # what holds the fds of the programs loaded here
    unloaded = ""  # why no program was loaded: the loader does not answer
    summaries, warnings = [], policy_warnings(policy, found, names)
    for target in found:
        rules = policy.rules_for(target.name or "")
        lf = None
        if not rules.empty:
            if rules not in loaded and not unloaded:
                plan = program.plan_program(rules)
                if print_filter and not as_json:
                    sys.stdout.write(f"/* ===== {target.title} ===== */\n{program.render(plan)}")
                try:
                    loaded[rules], refused = _load(plan, env, broker, kept)
                except AlfError as err:
                    if broker is None or err.exit_code != EX_UNAVAILABLE:
                        raise
                    unloaded = err.line().removeprefix("alfwrapper: ")
                    warnings.append(f"no program was compiled or loaded: {unloaded}")
                    refused = ""
                if refused:
                    warnings.append(
                        f"{target.title}: the verifier refuses its program with CAP_BPF alone, "
                        f"as the shipped units and the loader load it: {refused}"
                    )
            lf = loaded.get(rules)
        summaries.append(summary(target, rules, lf, planned=not rules.empty))
        warnings += [w for w in warnings_for(policy, target, rules) if w not in warnings]
    if as_json:
        report = {
            "ok": not (strict and warnings),
            "files": list(policy.files),
            "sockets": summaries,
            "warnings": warnings,
        }
        print(json.dumps(report, indent=2))
    else:
        for target, s in zip(found, summaries, strict=True):
            print(_line(target, s))
        for warning in warnings:
            print(f"warning: {warning}")
    if strict and warnings:
        raise AlfError(
            "check --strict",
            f"{len(warnings)} warning(s)",
            "fix the rules above, or drop --strict",
            EX_CONFIG,
        )
    if not as_json:
        print(
            "ok: the wrapper would start with this policy"
            if not unloaded
            else "ok as far as checked: the rules are valid; whether their programs load was "
            "not checked (the warning above says why)"
        )
    return 0
