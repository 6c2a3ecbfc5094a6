"""Plan one socket's filter program: which parts, the C that composes them, and map contents.

Pure: the same SocketRules always give the same C text and macros.  A packet
passes only if every configured part passes it; parts not configured are not
in the program at all, so they cost nothing per packet.  Order: interface
(one lookup), subnets, knocking (it keeps state, so only sources the other
rules allow can move it), then the developer's filter, whose return value is
the program's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from alfwrapper import knocking
from alfwrapper.errors import EX_DATAERR, AlfError
from alfwrapper.rules import FILTER_LIMIT, SocketRules, read_text_input
from alfwrapper.subnet_table import SubnetTable, build_subnet_table

FILTER_DIR = Path(__file__).resolve().parent / "filters"
ENTRY = "filter"
BODY = "alf_body"  # the composed parts, when the entry point must tail-call them
USER_ENTRY = "alf_user_filter"
RESERVED_PREFIXES = ("subnet_", "iface_", "knock_", "alf_")

# The developer's entry point, as the docs tell them to write it.
_ENTRY_RE = re.compile(
    r"^(?P<lead>[ \t]*)int[ \t]+filter[ \t]*"
    r"\((?P<args>[ \t]*struct[ \t]+__sk_buff[ \t]*\*[ \t]*\w+[ \t]*)\)",
    re.M,
)


@dataclass(frozen=True)
class ProgramPlan:
    """What to compile, with which macros, and what to put in the maps."""

    rules: SocketRules
    text: str
    defines: tuple[tuple[str, str], ...]
    include_dirs: tuple[str, ...]
    subnets: SubnetTable | None
    knock: knocking.KnockPlan | None
    hook: bool = False

    @property
    def cflags(self) -> list[str]:
        return [f"-I{d}" for d in self.include_dirs] + [f"-D{n}={v}" for n, v in self.defines]


# The restart hook, for sockets systemd keeps across service restarts.  The
# filter on such a socket is locked and outlives the wrapper, so a restarted
# wrapper cannot replace it; instead it puts its new program in alf_next[0],
# and the old program tail-calls it first thing: the new rules are in force at
# once.  While alf_next[0] is empty (first start, or the map was lost with
# systemd's fd store), the program applies its own rules.  alf_next is kept in
# the fd store (activation.store_fd) between runs.
HOOK_MAP = "BPF_PROG_ARRAY(alf_next, 1);\n"
HOOK_CALL = "    alf_next.call(skb, 0); /* newer rules, if a restarted wrapper put them */\n"


def _custom_source(path_text: str) -> str:
    path = Path(path_text)
    text = read_text_input(path_text, "--filter", "give a restricted-C file", FILTER_LIMIT)
    matches = list(_ENTRY_RE.finditer(text))
    if len(matches) != 1:
        line = text[: matches[1].start()].count("\n") + 1 if matches else 1
        raise AlfError(
            f"{path}:{line}",
            "needs exactly one entry function `int filter(struct __sk_buff *skb)`"
            if not matches
            else "defines `filter` twice",
            "see alfwrapper/filters/subnets.c for the shape",
            EX_DATAERR,
        )
    m = matches[0]
    # Same line, so the compiler's line numbers still match the file.
    renamed = f"{m.group('lead')}static __always_inline int {USER_ENTRY}({m.group('args')})"
    text = text[: m.start()] + renamed + text[m.end() :]
    return f'#line 1 "{path.resolve()}"\n{text}\n'


def plan_program(rules: SocketRules, hook: bool = False) -> ProgramPlan:
    """The program for these rules; ``hook`` adds the restart hook (see HOOK)."""
    defines: list[tuple[str, str]] = []
    parts = ["common.h"]
    # Malformed packets first: not IP, unreadable headers, IPv4-mapped IPv6
    # sources (common.h).  Every part after this reads the parsed headers.
    body: list[str] = ["    if (!alf_parse_packet(skb, &pkt))\n        return ALF_DROP;"]
    if rules.interfaces:
        parts.append("interfaces.c")
        defines.append(("IFACE_SLOTS", str(max(4096, len(rules.interfaces)))))
        body.append("    if (!interfaces_pass(skb))\n        return ALF_DROP;")
    table = None
    if rules.subnets.allow or rules.subnets.deny:
        table = build_subnet_table(rules.subnets)
        parts.append("subnets.c")

        def steps(levels: tuple[int, ...]) -> str:
            return " ".join(f"SUBNET_STEP({n})" for n in levels)

        defines += [
            ("SUBNET_NODES", str(max(1, len(table.nodes)))),
            ("V4_STEPS", steps(table.levels[4])),
            ("V6_STEPS", steps(table.levels[6])),
        ]
        body.append("    if (!subnets_pass(pkt.family, pkt.addr))\n        return ALF_DROP;")
    knock = None
    if rules.knock:
        knock = knocking.plan_knock(rules.knock)
        parts.append("knocking.c")
        defines += [
            ("KNOCK_ROWS", str(knock.rows)),
            ("KNOCK_SOURCES", str(rules.knock.sources)),
            ("KNOCK_SECRET", "1" if rules.knock.secret else "0"),
        ]
        body.append("    if (!knock_pass(skb, &pkt))\n        return ALF_DROP;")
    include_dirs = [str(FILTER_DIR)]
    custom = ""
    if rules.custom:
        custom = _custom_source(rules.custom.path)
        parts.append("developer.h")
        include_dirs.append(str(Path(rules.custom.path).resolve().parent))
        body.append(f"    skb->cb[ALF_L4_CB] = pkt.l4_offset;\n    return {USER_ENTRY}(skb);")
    else:
        body.append("    return ALF_PASS;")
    # BCC rewrites map syntax (m.lookup()) only in the main file, not in
    # #included ones, so the parts are pasted in, each with a #line marker so
    # that compiler messages still name the part's own file and line.
    includes = "".join(f'#line 1 "{FILTER_DIR / p}"\n{(FILTER_DIR / p).read_text()}' for p in parts)
    # With interface rules, the entry point tail-calls the body through
    # iface_alive, a program array that only the interface watcher holds open:
    # when the watcher dies, the kernel empties the array, the call fails, and
    # every packet is dropped (interfaces.c).
    body_name = BODY if rules.interfaces else ENTRY
    entry = (
        f"int {ENTRY}(struct __sk_buff *skb)\n{{\n    iface_alive.call(skb, 0);\n"
        "    return ALF_DROP; /* the interface watcher is gone: fail closed */\n}\n"
        if rules.interfaces
        else ""
    )
    text = (
        "/* Generated by alfwrapper: the parts this socket's rules use, composed. */\n"
        "#define ALF_PART 1\n"
        f"{includes}" + (HOOK_MAP if hook else "") + f"{custom}"
        '#line 1 "alfwrapper-composed.c"\n'
        f"int {body_name}(struct __sk_buff *skb)\n"
        "{\n"
        "    struct alf_packet pkt = {};\n" + "\n".join(body) + "\n}\n" + entry
    )
    return ProgramPlan(
        rules=rules,
        text=text,
        defines=tuple(defines),
        include_dirs=tuple(include_dirs),
        subnets=table,
        knock=knock,
    )


def render(plan: ProgramPlan) -> str:
    """The C as BCC compiles it: the macros, then the composed text."""
    lines = ["/* alfwrapper: the program for one socket, compiled by BCC with these macros */"]
    lines += [f"#define {name} {value}" for name, value in plan.defines]
    return "\n".join(lines) + "\n" + plan.text
