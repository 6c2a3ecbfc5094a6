"""Plan one socket's filter program: the parts its rules use, composed into one C text.

Pure: the same SocketRules always give the same C text and settings (the
rules themselves go into maps, never into code).  A packet passes only if
every part in use passes it, in the order of parts.PARTS: interface (one
lookup), subnets, knocking (it keeps state, so only sources the other rules
allow can move it), then the developer's filter, whose return value is the
program's.  Parts not in use are not in the program, so they cost nothing.
Every verdict is counted by its reason (common.h).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from alfwrapper.bpf.parts import (
    EARLY_LOCAL_ADDRESSES,
    EARLY_LOCAL_C,
    EARLY_PORT_C,
    EARLY_PORTS,
    PARTS,
    REASONS,
    RESERVED_PREFIXES,
    RUNTIME_ALLOW,
    RUNTIME_DENY,
    SET_ALLOW,
    SET_DENY,
    SETS,
    PartPlan,
    Pins,
    declared_maps,
)
from alfwrapper.errors import EX_DATAERR, AlfError, excerpt
from alfwrapper.host.bpf_calls import BPF_PROG_TYPE_SOCKET_FILTER, BPF_PROG_TYPE_XDP
from alfwrapper.policy.inputs import FILTER_LIMIT, read_text_input
from alfwrapper.policy.rules import SocketRules
from alfwrapper.record import Record

ENTRY = "filter"  # the entry point's name when the program has no label
LOG_PAGES = 64  # the drop log's ring buffer: 64 pages, about 6,000 events
USER_ENTRY = "alf_user_filter"
LABEL_LIMIT = 10  # a label, "." and a role of at most 4 fill a kernel object name (15)

# Each map's role in its name (declaration -> role), so that `bpftool map`
# says what a map is for as well as whose it is.
MAP_ROLES = {
    "alf_counters": "cnt",
    "alf_events": "log",
    "alf_log_bucket": "logb",
    "alf_runtime": "rt",
    "alf_runtime_count": "rtn",
    "iface_allowed": "ifok",
    "iface_alive": "ifup",
    "iface_lease": "ifls",
    "knock_config": "kcfg",
    "knock_ports": "kprt",
    "knock_used": "kuse",
    "knock_state": "kst",
    "knock_listeners": "klst",
    "subnet_v4": "sn4",
    "subnet_leaves": "snl",
    "subnet_roots": "snr",
    "subnet_v6": "sn6",
    "subnet_nodes": "snn",
}


def label(service: str, protocol: str, port: int) -> str:
    """Which service and socket a program serves, in a kernel object name: the
    service (cut short, in C identifier characters), the protocol's initial and the
    port, as in ``web_t8080``.  Programs are named by it, maps by it and their role
    (``web_t8080.cnt``)."""
    tag = f"{protocol[:1] or 'x'}{port}"
    service = re.sub(r"[^A-Za-z0-9_]", "_", service)
    if not service[:1].isalpha():
        service = "s" + service
    return f"{service[: max(1, LABEL_LIMIT - 1 - len(tag))]}_{tag}"[:LABEL_LIMIT]


def object_name(label_: str, role: str) -> str:
    """A map's name: the label and its role, within the kernel's 15 characters."""
    return f"{label_}.{MAP_ROLES.get(role, role.removeprefix('alf_'))}"[:15]


# The developer's entry point, as the docs tell them to write it.
_ENTRY_RE = re.compile(
    r"^(?P<lead>[ \t]*)int[ \t]+filter[ \t]*"
    r"\((?P<args>[ \t]*struct[ \t]+__sk_buff[ \t]*\*[ \t]*\w+[ \t]*)\)",
    re.M,
)


@cache
def filter_dir() -> Path:
    """filters/: at the top of a checkout, or inside the installed package (the wheel
    maps the top-level folder to alfwrapper/filters)."""
    here = Path(__file__).resolve().parents[1]  # the alfwrapper package
    for candidate in (here / "filters", here.parent / "filters"):
        if (candidate / "common.h").is_file():
            return candidate
    raise AlfError(
        "alfwrapper's filters",
        f"common.h is in neither {here / 'filters'} nor {here.parent / 'filters'}",
        "reinstall alfwrapper",
        EX_DATAERR,
    )


class ProgramPlan(Record):
    """What to compile, with which settings, and what to put in the maps."""

    rules: SocketRules
    text: str
    defines: tuple[tuple[str, str], ...]
    include_dirs: tuple[str, ...]
    parts: tuple[PartPlan, ...]
    pinned: tuple[tuple[str, str], ...] = ()  # (map, pin path), for compiler.py
    # The pinned maps are borrowed as they are (explain SERVICE): never made, replaced
    # or pinned; one missing, or of another shape, is an error.
    borrowed: bool = False
    label: str = ""  # which service and socket (label()): names the maps and programs
    entry: str = ENTRY  # the entry point's function
    body: str = ENTRY + "_b"  # the composed parts, when the entry point tail-calls them
    kind: int = BPF_PROG_TYPE_SOCKET_FILTER  # or XDP: early drop (sets/early.py)

    @property
    def programs(self) -> dict[str, str]:
        """Each function loaded as a program, with the kernel's name for it: the label
        (and ``LABEL_b`` for the body), so that the C, and so the program cache's key,
        is the same for every socket with the same rules."""
        functions = [self.entry] + ([self.body] if self.rules.interfaces else [])
        if not self.label:
            return {f: f for f in functions}
        return {f: self.label + ("_b" if f == self.body else "") for f in functions}

    @property
    def cflags(self) -> list[str]:
        return [f"-I{d}" for d in self.include_dirs] + [f"-D{n}={v}" for n, v in self.defines]

    def data(self, name: str) -> Any:
        """A part's planned map contents (the subnet table, the knock plan), or None."""
        return next((p.data for p in self.parts if p.part.name == name), None)

    @property
    def part_names(self) -> tuple[str, ...]:
        return tuple(p.part.name for p in self.parts)


# Preprocessor lines (after comments and line continuations are taken out), and
# what may follow #include in a filter the loader compiles.
_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*(\w+)(.*)$", re.M)
_LITERAL_INCLUDE = re.compile(r'^[ \t]*"([A-Za-z0-9_.-]+\.h)"[ \t]*$')
_PRAGMAS = (["unroll"], ["nounroll"], ["clang"])  # loop hints only


def _without_comments(text: str) -> str:
    """C text with each comment replaced by a space (newlines kept), as the
    preprocessor sees it: a comment opener inside a string or character literal is
    not one."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            end = i + 1
            while end < n and text[end] not in (c, "\n"):
                end += 2 if text[end] == "\\" else 1
            out.append(text[i : end + 1])
            i = end + 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            out.append(" ")
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(" " + "\n" * text.count("\n", i, end))
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def checked_source(text: str, where: str) -> str:
    """A filter's text from someone who may not read the loader's files: it may include
    only alfwrapper's own headers, by name, and nothing may name a file in another way
    (computed includes, __has_include, #embed, _Pragma, trigraphs).  The compiler
    then never opens a file of theirs choosing, so its messages cannot show one."""
    allowed = sorted(p.name for p in filter_dir().glob("*.h"))
    flat = _without_comments(text.replace("\\\r\n", "").replace("\\\n", ""))

    def refuse(offset: int, why: str) -> AlfError:
        line = flat[:offset].count("\n") + 1
        return AlfError(
            f"{where}:{line}",
            why,
            f"through the loader a filter may include only alfwrapper's headers: "
            f"{', '.join(allowed)}",
            EX_DATAERR,
        )

    for word in ("__has_include", "_Pragma", "??=", "__FILE_NAME__"):
        if word in flat:
            raise refuse(flat.index(word), f"uses {word}")
    for m in _DIRECTIVE.finditer(flat):
        directive, rest = m.group(1), m.group(2)
        if directive in ("include", "include_next", "import", "embed"):
            name = _LITERAL_INCLUDE.match(rest)
            if directive != "include" or not name or name.group(1) not in allowed:
                raise refuse(m.start(), f"#{directive}{excerpt(rest, quote=False)} is not allowed")
        elif directive == "pragma" and rest.split()[:1] not in _PRAGMAS:
            raise refuse(m.start(), f"#pragma{excerpt(rest, quote=False)} is not allowed")
        elif directive == "line" or directive.isdigit():  # names a file in messages
            raise refuse(m.start(), f"#{directive} is not allowed")
    return text


def check_map_names(text: str, where: str) -> None:
    """A developer's filter may not declare a map whose name a part reserves: it would
    clash with a built-in map now, or with one a later version adds."""
    for name, line in declared_maps(text):
        if not name.startswith(RESERVED_PREFIXES):
            continue
        why = (
            f"map {name!r} has the name of alfwrapper's own map {name}"
            if name in MAP_ROLES
            else f"map name {name!r} is reserved"
        )
        raise AlfError(
            f"{where}:{line}",
            why,
            f"rename it: names starting with {', '.join(RESERVED_PREFIXES)} belong to "
            "alfwrapper's parts",
            EX_DATAERR,
        )


def _custom_source(path_text: str, source: str = "") -> str:
    path = Path(path_text)
    if source:
        text = checked_source(source, path_text)
    else:
        text = read_text_input(path_text, "--filter", "give a restricted-C file", FILTER_LIMIT)
    matches = list(_ENTRY_RE.finditer(text))
    if len(matches) != 1:
        line = text[: matches[1].start()].count("\n") + 1 if matches else 1
        raise AlfError(
            f"{path}:{line}",
            "needs exactly one entry function `int filter(struct __sk_buff *skb)`"
            if not matches
            else "defines `filter` twice",
            "see examples/filters/allowlist.c for the shape",
            EX_DATAERR,
        )
    check_map_names(text, path_text)
    m = matches[0]
    # Same line, so the compiler's line numbers still match the file.
    renamed = f"{m.group('lead')}static __always_inline int {USER_ENTRY}({m.group('args')})"
    text = text[: m.start()] + renamed + text[m.end() :]
    shown = path_text if source else str(path.resolve())
    return f'#line 1 "{shown}"\n{text}\n'


def _reason(name: str) -> str:
    return f"ALF_REASON_{name.upper()}"


def plan_program(rules: SocketRules, pins: Pins | None = None, label_: str = "") -> ProgramPlan:
    """The program for these rules; with ``pins``, for a socket whose state is pinned
    (its counters, runtime rules and knock state then outlive the program); with
    ``label_`` (label()), named for the service and socket it serves."""
    entry_name = ENTRY
    body_name = f"{entry_name}_b"
    plans = tuple(p.plan(rules, pins) for p in PARTS if p.used(rules, pins))
    used = {p.part.name for p in plans}
    folder = filter_dir()
    defines: list[tuple[str, str]] = [(_reason(r), str(i)) for i, r in enumerate(REASONS)]
    defines += [
        ("ALF_REASONS", str(len(REASONS))),
        ("ALF_RUNTIME_ALLOW", str(RUNTIME_ALLOW)),
        ("ALF_RUNTIME_DENY", str(RUNTIME_DENY)),
        ("ALF_SET_ALLOW", str(SET_ALLOW)),
        ("ALF_SET_DENY", str(SET_DENY)),
    ]
    pinned = [("alf_counters", pins.path("counters"))] if pins is not None else []
    # The transport header is read only where a part reads it (common.h): a helper
    # call a subnet filter need not make, for a header the kernel checked already; the
    # drop log reads a logged event's ports itself.
    if any(p.part.ports for p in plans):
        defines.append(("ALF_PORTS", "1"))
    structs = ""
    if rules.log_rate:
        from alfwrapper.bpf.parts import BUCKET_C, EVENT_C  # noqa: PLC0415

        defines += [("ALF_LOG_RATE", str(rules.log_rate)), ("ALF_LOG_PAGES", str(LOG_PAGES))]
        structs = EVENT_C + BUCKET_C
        if pins is not None:
            pinned += [
                ("alf_events", pins.path("events")),
                ("alf_log_bucket", pins.path("log_bucket")),
            ]
    # Malformed packets first: not IP, unreadable headers, IPv4-mapped IPv6
    # sources (common.h).  Every part after this reads the parsed headers.
    body = [
        "    if (!alf_parse_packet(skb, &pkt))\n"
        f"        return alf_drop(skb, &pkt, {_reason('malformed')});"
    ]
    pasted = [f'{structs}#line 1 "{folder / "common.h"}"\n{(folder / "common.h").read_text()}']
    include_dirs = [str(folder)]
    custom = ""
    for plan in plans:
        defines += plan.defines
        pinned += plan.pinned
        pasted.append(plan.prelude)
        for source in (plan.part.source, *plan.more):
            pasted.append(f'#line 1 "{folder / source}"\n{(folder / source).read_text()}')
        condition = plan.condition or plan.part.condition
        if condition:
            body.append(
                f"    if (!({condition}))\n"
                f"        return alf_drop(skb, &pkt, {_reason(plan.part.reason)});"
            )
    if rules.custom:
        custom = _custom_source(rules.custom.path, rules.custom.source)
        if not rules.custom.source:  # its own headers, beside it
            include_dirs.append(str(Path(rules.custom.path).resolve().parent))
        body.append(
            f"    skb->cb[ALF_L4_CB] = pkt.l4_offset;\n"
            f"    int kept = {USER_ENTRY}(skb);\n"
            f"    if (!kept)\n        return alf_drop(skb, &pkt, {_reason('filter')});\n"
            f"    alf_count({_reason('passed')});\n    return kept;"
        )
    else:
        body.append(f"    return alf_count({_reason('passed')});")
    # With interface rules, the entry point tail-calls the body through
    # iface_alive, a program array that only the interface watcher holds open:
    # when the watcher dies, the kernel empties the array, the call fails, and
    # every packet is dropped (interfaces.c).
    watched = "interfaces" in used
    entry = (
        f"int {entry_name}(struct __sk_buff *skb)\n{{\n    iface_alive.call(skb, 0);\n"
        f"    /* the interface watcher is gone: fail closed */\n"
        f"    return alf_count({_reason('interfaces')});\n}}\n"
        if watched
        else ""
    )
    # BCC rewrites map syntax (m.lookup()) only in the main file, not in
    # #included ones, so the parts are pasted in, each with a #line marker so
    # that compiler messages still name the part's own file and line.
    text = (
        "/* Generated by alfwrapper: the parts this socket's rules use, composed. */\n"
        + "".join(pasted)
        + custom
        + '#line 1 "alfwrapper-composed.c"\n'
        + f"int {body_name if watched else entry_name}(struct __sk_buff *skb)\n"
        + "{\n    struct alf_packet pkt = {};\n    u32 alf_rt = 0; /* a runtime rule's verdict */\n"
        + "    u32 alf_set = 0; /* the named sets' verdict */\n"
        + "\n".join(body)
        + "\n}\n"
        + entry
    )
    return ProgramPlan(
        rules=rules,
        text=text,
        defines=tuple(defines),
        include_dirs=tuple(include_dirs),
        parts=plans,
        pinned=tuple(pinned),
        label=label_,
        entry=entry_name,
        body=body_name,
    )


EARLY_ENTRY = "alf_early"


def plan_early(deny_sets: tuple[str, ...], label_: str) -> ProgramPlan:
    """The XDP program that drops early, on one interface, what these deny sets' sockets
    would drop (filters/early.c): sets.c's reading of the sets, bound as a socket's
    program's are (Sets.bind), and early.c's entry point."""
    rules = SocketRules(deny_sets=deny_sets)
    sets_plan = SETS.plan(rules, None)
    folder = filter_dir()
    defines = [
        ("ALF_RUNTIME_ALLOW", str(RUNTIME_ALLOW)),
        ("ALF_SET_ALLOW", str(SET_ALLOW)),
        ("ALF_SET_DENY", str(SET_DENY)),
        ("ALF_EARLY_PORTS", str(EARLY_PORTS)),
        ("ALF_EARLY_LOCAL", str(EARLY_LOCAL_ADDRESSES)),
        *sets_plan.defines,
    ]
    pasted = [
        "/* Generated by alfwrapper: early drop for deny sets, at XDP. */\n",
        f'#line 1 "{folder / "common.h"}"\n{(folder / "common.h").read_text()}',
        EARLY_PORT_C + EARLY_LOCAL_C + sets_plan.prelude,
        f'#line 1 "{folder / "sets.c"}"\n{(folder / "sets.c").read_text()}',
        f'#line 1 "{folder / "early.c"}"\n{(folder / "early.c").read_text()}',
    ]
    return ProgramPlan(
        rules=rules,
        text="".join(pasted),
        defines=tuple(defines),
        include_dirs=(str(folder),),
        parts=(sets_plan,),
        label=label_,
        entry=EARLY_ENTRY,
        kind=BPF_PROG_TYPE_XDP,
    )


def render(plan: ProgramPlan) -> str:
    """The C as BCC compiles it: the settings, then the composed text."""
    lines = ["/* alfwrapper: the program for one socket, compiled by BCC with these settings */"]
    lines += [f"#define {name} {value}" for name, value in plan.defines]
    return "\n".join(lines) + "\n" + plan.text
