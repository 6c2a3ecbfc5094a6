"""A socket unit's policy as systemd's own filter: denied peers dropped before accept.

With ``Accept=yes`` systemd accepts every connection and starts one service
per connection; the wrapper then judges the peer.  A denied peer would cost a
whole start.  A socket unit that names its policy in its [Socket] section
(``X-AlfwrapperPolicy=NAME``, a key systemd ignores) gets, from
``alfwrapper generator`` (systemd.generator(7), at boot and at every
``systemctl daemon-reload``), a drop-in with ``IPAddressDeny=any`` and the
policy's allowed prefixes as ``IPAddressAllow=``: systemd attaches that to the
socket unit's cgroup, so the kernel drops a denied peer's SYN at the listener
and systemd never accepts it.

The rendering is a superset of the policy, never narrower: every part of a
socket's rules narrows what its subnet allow list lets in (a packet must pass
every part), so the union of the allow lists of every socket the policy may
name lets in everything the wrapper would.  Deny lines, knocking, interfaces and
a developer's filter stay the wrapper's to judge.  It fits only where every
socket has allow rules (an empty allow list passes every source) and the
union is at most MAX_PREFIXES long; otherwise no drop-in is written, and the
wrapper judges as before.  A policy that cannot be read gives the socket
``IPAddressDeny=any`` alone: the wrapper would refuse every connection anyway.
Only Accept=yes sockets are served: an Accept=no service may be given live
``alfwrapper allow`` rules, which a drop-in written at boot would not know.
The list comes from the named policy alone: rules the service's own command
line adds (``--policy NAME --allow ...``) are not in it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from alfwrapper.errors import EX_CONFIG, AlfError
from alfwrapper.policy.files import build_policy, read_policy

KEY = "X-AlfwrapperPolicy"
DROP_IN = "50-alfwrapper-policy.conf"
DENY_ALL = "[Socket]\nIPAddressDeny=any\n"
MAX_PREFIXES = 10_000  # an IPAddressAllow= list systemd loads in an instant
UNIT_FILE_LIMIT = 1 << 20
# systemd's system unit search path (systemd.unit(5)), first match wins; the
# generators' own folders are left out (a generator never reads another's output).
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)
_TRUE = ("1", "yes", "y", "true", "t", "on")


class DoesNotFit(AlfError):
    """The policy cannot be written as IPAddressAllow= (no drop-in: the wrapper judges)."""

    def __init__(self, policy_name: str, why: str, hint: str) -> None:
        super().__init__(f"policy {policy_name}", why, hint, EX_CONFIG)


def socket_settings(text: str) -> dict[str, str]:
    """The [Socket] section's keys (the last of each wins, as in systemd)."""
    settings: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Socket" and "=" in line:
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def opted_in(unit_dirs: Sequence[Path]) -> dict[str, str]:
    """Socket units that name a policy: {unit name: policy name}, the first file of
    each name on the search path (a link to /dev/null masks it)."""
    seen: set[str] = set()
    found: dict[str, str] = {}
    for folder in unit_dirs:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".socket") or name in seen or "@." in name:
                continue
            seen.add(name)
            path = folder / name
            try:
                if path.resolve() == Path("/dev/null") or path.stat().st_size > UNIT_FILE_LIMIT:
                    continue
                settings = socket_settings(path.read_text(errors="replace"))
            except OSError:
                continue
            if KEY in settings and settings.get("Accept", "").lower() in _TRUE:
                found[name] = settings[KEY]
    return found


def allowed_prefixes(policy_name: str, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The union of the allow lists of every socket the policy may name, as text,
    and the policy files read.  Raises DoesNotFit where it does not fit."""
    entries, listens, files = read_policy(policy_name, environ)
    policy = build_policy(entries, listens, (), files)
    every = policy.rules_for("")  # a socket whose name no scope gives
    if not every.subnets.allow:
        raise DoesNotFit(
            policy_name,
            "lets every source reach some socket (no allow rules for every socket)",
            "add allow rules for every socket, or leave the unit without X-AlfwrapperPolicy=",
        )
    texts: dict[str, None] = {}
    for name in ["", *sorted(policy.names)]:
        for prefix in policy.rules_for(name).subnets.allow:
            texts[str(prefix)] = None
            if len(texts) > MAX_PREFIXES:
                raise DoesNotFit(
                    policy_name,
                    f"allows more than {MAX_PREFIXES:,} prefixes, too many for IPAddressAllow=",
                    "the wrapper judges each peer instead",
                )
    return list(texts), files


def render(unit: str, policy_name: str, environ: Mapping[str, str]) -> str:
    """The drop-in for one socket unit: its policy's allow list, or deny every peer
    when the policy cannot be read.  Raises DoesNotFit."""
    head = f"# Written by alfwrapper generator for {unit} from policy {policy_name}"
    try:
        prefixes, files = allowed_prefixes(policy_name, environ)
    except DoesNotFit:
        raise
    except AlfError as err:
        print(
            f"alfwrapper generator: {unit}: {err.line().removeprefix('alfwrapper: ')}; "
            "every peer is dropped until it is fixed (then systemctl daemon-reload)",
            file=sys.stderr,
        )
        return f"{head}: it could not be read, so no peer may connect.\n{DENY_ALL}"
    lines = [f"{head} ({', '.join(files)}).", DENY_ALL.rstrip()]
    lines += [f"IPAddressAllow={' '.join(prefixes[i : i + 8])}" for i in range(0, len(prefixes), 8)]
    return "\n".join(lines) + "\n"


def generate(normal: Path, environ: Mapping[str, str]) -> int:
    """systemd.generator(7): a drop-in in ``normal`` for each opted-in socket unit."""
    dirs = environ.get("ALFWRAPPER_UNIT_PATH")
    unit_dirs = [Path(p) for p in (dirs.split(":") if dirs else UNIT_DIRS) if p]
    for unit, policy_name in opted_in(unit_dirs).items():
        try:
            text = render(unit, policy_name, environ)
        except DoesNotFit as err:
            print(
                f"alfwrapper generator: {unit}: {err.line().removeprefix('alfwrapper: ')}",
                file=sys.stderr,
            )
            continue
        folder = normal / f"{unit}.d"
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{DROP_IN}.new"  # no name systemd reads: whole or absent
        partial.write_text(text)
        os.replace(partial, folder / DROP_IN)
    return 0
