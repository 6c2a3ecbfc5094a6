"""CrowdSec decisions, as a set's entries: the answers of the Local API's stream
(GET /v1/decisions/stream) read strictly, and kept by decision so that what a set
holds is always what the LAPI has in force.  Pure: no network, no kernel, no clock
(the caller says what time it is, in monotonic nanoseconds).

What the stream says, and what follows for this book (crowdsec's
pkg/apiserver/controllers/v1/decisions.go and pkg/database/decisions.go, v1.4.6 as
Debian 12 ships it, to v1.7):
- ``{"new": [...], "deleted": [...]}``; either may be ``null`` (1.4.6 sends that for
  an empty list).
- A decision: ``id``, ``type`` ("ban", "captcha", ...), ``scope`` ("Ip" or "Range",
  any case), ``value`` (a range may have host bits: "192.0.2.7/24"), ``duration``
  (Go's time.Duration text of what is left, "3h59m58.123456789s"; negative in
  ``deleted``).  Only bans of scope Ip and Range become entries; the rest are counted
  and skipped, and so are bans wider than the bouncer's limit (WIDEST).
- ``startup=true`` answers every decision in force (and expired ones, in
  ``deleted``): the book is replaced, not merged (``snapshot``).  Later calls give
  what changed since the last (``delta``); a deletion may come twice (the LAPI looks
  two seconds back), so applying one is idempotent.
- Decisions on one network may overlap (two bans, different durations).  An entry
  lasts as long as its longest standing decision; deleting one leaves the others.
- Rows the LAPI drops without saying (an alert deleted, a list refreshed) are never
  reported: every entry carries its own expiry, so it lapses anyway.
"""

from __future__ import annotations

import heapq
import ipaddress
import json
import re
import socket
from collections.abc import Iterable
from typing import Any, NamedTuple

from alfwrapper.errors import EX_PROTOCOL, AlfError, excerpt
from alfwrapper.policy.prefixes import Prefix
from alfwrapper.record import Record

DECISIONS_LIMIT = 1_000_000  # decisions in one answer (a community blocklist is ~30,000)
LONGEST_NS = 100 * 365 * 86400 * 10**9  # a longer ban is kept this long
VALUE_LIMIT = 64  # characters of an address or range
SCOPES = ("ip", "range")
_SCOPES = {"Ip": "ip", "Range": "range"}  # as the LAPI spells them

# The widest ban applied, by family (a prefix length; the config's widest-ipv4 and
# widest-ipv6): a wider one is counted and left out (Answer.too_wide).  /8 is the
# most address space one holder has in IPv4 (the legacy blocks IANA gave out whole),
# /32 the usual allocation to an IPv6 registry member (RIPE's and ARIN's minimum):
# a ban wider than that covers networks no one scenario judged, and is far likelier
# a mistyped `cscli decisions add --range` than a decision, so a fleet's set should
# not drop every source on it (sshd included).  0.0.0.0/0 and ::/0 are left out
# whatever the limit (read_answer): they ban everyone.
WIDEST_IPV4 = 8
WIDEST_IPV6 = 32

_UNIT_NS = {"h": 3_600 * 10**9, "m": 60 * 10**9, "s": 10**9, "ms": 10**6,
            "us": 10**3, "µs": 10**3, "μs": 10**3, "ns": 1}  # fmt: skip
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(h|ms|us|µs|μs|ns|m|s)")


def duration_ns(text: Any) -> int:
    """Go's time.Duration text ("72h3m0.5s", "-7.34s", "0s", "1.5ms") in nanoseconds."""
    if not isinstance(text, str) or not 0 < len(text) <= 64:
        raise ValueError(f"duration {excerpt(repr(text))} is not Go's duration text")
    common = _lapi_form(text)
    return common if common is not None else _general_duration_ns(text)


# The form the LAPI writes, [-][Hh][Mm]S[.F]s: one match a decision (a million an
# answer); any other form goes the general way.  tests/unit/test_crowdsec_stream.py holds both
# to the same answers.
# The runs of digits are possessive (Python 3.11): each is followed by its unit, so
# giving digits back finds no match, and not trying is a sixth faster.  Not the
# optional groups: 3.11.2's ``(?:...)?+`` matched "0.s".  The test holds this to
# the plain pattern.
_LAPI_FORM = re.compile(
    r"(-?)(?:([0-9]{1,12}+)h)?(?:([0-9]{1,2}+)m)?([0-9]{1,2}+)(?:\.([0-9]{1,9}+))?s"
)


def _lapi_form(text: str) -> int | None:
    match = _LAPI_FORM.fullmatch(text)
    if match is None:
        return None
    minus, hours, minutes, seconds, fraction = match.groups("0")  # "0": not there
    total = (int(hours) * 3600 + int(minutes) * 60) * 10**9 + int(seconds + fraction.ljust(9, "0"))
    return -total if minus else total


def _general_duration_ns(text: str) -> int:
    sign, body = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    if body == "0":
        return 0
    total, at = 0, 0
    for match in _DURATION.finditer(body):
        if match.start() != at:
            break
        number, unit = match.groups()
        whole, _, fraction = number.partition(".")
        scale = _UNIT_NS[unit]
        total += int(whole or 0) * scale + (
            int(fraction) * scale // 10 ** len(fraction) if fraction else 0
        )
        at = match.end()
    if at != len(body) or not body:
        raise ValueError(f"duration {excerpt(repr(text))} is not Go's duration text")
    return sign * total


class Decision(NamedTuple):
    """One ban as the book keeps it: which decision, on what network, until when
    (monotonic ns).  A NamedTuple, as Prefix is: an answer may bring a million."""

    id: int
    network: Prefix
    until: int


class Answer(Record):
    """One stream answer, read: the bans it brings and the decision ids it ends, and
    how many decisions it had that are not bans of an address or a range."""

    new: tuple[Decision, ...]
    ended: tuple[int, ...]
    skipped: int
    malformed: int = 0  # decisions that could not be read: left out, counted
    too_wide: tuple[Prefix, ...] = ()  # bans wider than the limit: left out


def _network(scope: str, value: Any) -> Prefix:
    if not isinstance(value, str) or not 0 < len(value) <= VALUE_LIMIT:
        raise ValueError(f"value {excerpt(repr(value))} is not an address or a range")
    if "/" not in value:  # an address, as most are: libc's inet_pton, ten times faster
        six = ":" in value
        try:
            address = int.from_bytes(
                socket.inet_pton(socket.AF_INET6 if six else socket.AF_INET, value), "big"
            )
        except OSError:
            pass  # ipaddress says what is wrong with it, below
        else:
            if not six:
                return Prefix(4, address, 32)
            if address >> 32 == 0xFFFF:  # ::ffff:a.b.c.d is a.b.c.d
                return Prefix(4, address & 0xFFFFFFFF, 32)
            return Prefix(6, address, 128)
    network = ipaddress.ip_network(value.strip(), strict=False)  # a range may have host bits
    if isinstance(network, ipaddress.IPv6Network) and network.network_address.ipv4_mapped:
        mapped = network.network_address.ipv4_mapped
        length = max(0, network.prefixlen - 96)
        network = ipaddress.ip_network(f"{mapped}/{length}", strict=False)
    family = 4 if network.version == 4 else 6
    return Prefix(family, int(network.network_address), network.prefixlen)


def load_answer(data: bytes) -> Any:
    """An answer's JSON.  An integer too long for Python to read (past 4,300 digits)
    makes json refuse the whole text: it is read again with such integers kept as
    text, so that only their decisions are malformed (read_answer)."""
    try:
        return json.loads(data)
    except ValueError:
        return json.loads(data, parse_int=_json_int)


def _json_int(text: str) -> int | str:
    return int(text) if len(text) <= 64 else text


def read_answer(
    answer: Any, now: int, widest: tuple[int, int] = (WIDEST_IPV4, WIDEST_IPV6)
) -> Answer:
    """A stream answer, checked whole: anything malformed is one AlfError naming the
    decision, and nothing of the answer is used (the caller keeps its book as it was).
    A decision that could not be read is left out and counted (``malformed``): one
    the LAPI should not have sent does not keep every other ban out, and a deletion
    left out lapses by its expiry.  A ban shorter than ``widest`` (IPv4, IPv6 prefix
    lengths; never /0) is left out too (``too_wide``), and ends any earlier decision
    with its id, as the LAPI no longer has that one."""
    shortest = (max(1, widest[0]), max(1, widest[1]))  # /0 bans everyone: never
    lists = _lists(answer)
    new: list[Decision] = []
    ended: list[int] = []
    over: dict[int, int] = {}  # a new one that has ended: its id, and where in ``new``
    too_wide: list[Prefix] = []
    skipped = malformed = 0
    usual = _usual(lists[0], now)
    if None not in usual:  # the LAPI's usual answer: bans on addresses alone
        new, usual = usual, []  # type: ignore[assignment]  # no None in it
    for item, short in zip(lists[0], usual, strict=False):
        if short is not None:
            new.append(short)
            continue
        try:
            read = _decision(item, now)
        except ValueError:
            malformed += 1
            continue
        if read is None:
            skipped += 1
        elif isinstance(read, int):
            ended.append(read)
            over[read] = len(new)
        elif read.network.length < shortest[read.network.family == 6]:
            too_wide.append(read.network)
            ended.append(read.id)
            over[read.id] = len(new)
        else:
            new.append(read)
    if over:  # in order: an end replaces the decisions before it with its id
        new = [d for at, d in enumerate(new) if at >= over.get(d.id, 0)]
    deleted, unread = _deleted_ids(lists[1])
    ended += deleted
    malformed += unread
    return Answer(tuple(new), tuple(ended), skipped, malformed, tuple(too_wide))


def _lists(answer: Any) -> list[list[Any]]:
    """The answer's "new" and "deleted" lists (a missing or null one is empty), checked
    for their shape and their length together."""
    if not isinstance(answer, dict):
        raise _bad("the answer is not a JSON object")
    lists = []
    for key in ("new", "deleted"):
        items = answer.get(key)
        if items is None:
            items = []
        if not isinstance(items, list):
            raise _bad(f'"{key}" is not a list')
        lists.append(items)
    if sum(map(len, lists)) > DECISIONS_LIMIT:
        raise _bad(f"more than {DECISIONS_LIMIT:,} decisions in one answer")
    return lists


def _deleted_ids(items: list[Any]) -> tuple[list[int], int]:
    """The ids of the "deleted" list's decisions, in order, and how many had none (an
    object with an integer id): those are left out, counted as malformed."""
    ids = []
    unread = 0
    for item in items:
        ident = item.get("id") if type(item) is dict else None
        if type(ident) is int:  # JSON's numbers; not a bool
            ids.append(ident)
        else:
            unread += 1
    return ids, unread


def _usual(items: list[Any], now: int) -> list[Decision | None]:
    """Each of the LAPI's usual decisions, a ban on one address that stands, its
    duration in the LAPI's own form, read the short way (a million an answer: one
    loop, its names at hand); None for any other, which _decision reads.
    tests/unit/test_crowdsec_stream.py holds both to the same answers."""
    read: list[Decision | None] = []
    keep, lapi_form, pton, new = read.append, _lapi_form, socket.inet_pton, _new
    for item in items:
        if type(item) is not dict or item.get("type") != "ban" or item.get("scope") != "Ip":
            keep(None)
            continue
        ident, text, value = item.get("id"), item.get("duration"), item.get("value")
        if type(ident) is not int or type(text) is not str or type(value) is not str:
            keep(None)
            continue
        left = lapi_form(text)
        if left is None or not 0 < left <= LONGEST_NS:
            keep(None)
            continue
        six = ":" in value  # as _network: no exception for an IPv6 address (a µs each)
        try:
            address = int.from_bytes(pton(_FAMILY[six], value), "big")
        except (OSError, ValueError):  # ValueError: a NUL or a lone surrogate in the text
            keep(None)
            continue
        if not six:
            network = (4, address, 32)
        elif address >> 32 != 0xFFFF:  # ::ffff:a.b.c.d: the long way makes it a.b.c.d
            network = (6, address, 128)
        else:
            keep(None)
            continue
        # Made as tuples are (NamedTuple's __new__ is a Python call; a third of a µs each).
        keep(new(Decision, (ident, new(Prefix, network), now + left)))
    return read


_new = tuple.__new__
_FAMILY = (socket.AF_INET, socket.AF_INET6)  # by whether the text has a colon


def _decision(item: Any, now: int) -> Decision | int | None:
    """One of an answer's new decisions, read: a ban, the id of one in force no
    longer, or None for one that is not a ban of an address or a range."""
    if type(item) is not dict:
        raise ValueError("not a JSON object")
    ident = item.get("id")
    if type(ident) is not int:  # JSON's numbers; not a bool
        raise ValueError(f"id {excerpt(repr(ident))} is not a number")
    given = item.get("scope")
    scope = _SCOPES.get(given, "") if type(given) is str else ""
    scope = scope or str(given).lower()
    kind = item.get("type")
    if (kind != "ban" and str(kind).lower() != "ban") or scope not in SCOPES:
        return None
    left = duration_ns(item.get("duration"))
    if left <= 0:
        return ident  # in force no longer
    left = min(left, LONGEST_NS)  # an expiry must fit the map's u64
    return Decision(ident, _network(scope, item.get("value")), now + left)


def _bad(why: str) -> AlfError:
    return AlfError(
        "the CrowdSec LAPI's decisions stream",
        why,
        "check the LAPI's version and the bouncer's URL; the set keeps what it had",
        EX_PROTOCOL,
    )


class Changes(Record):
    """What a set must do: entries to hold until a time (added or extended), and
    networks to take out."""

    hold: dict[Prefix, int]
    remove: frozenset[Prefix]


class Book(Record, frozen=False):
    """The bans in force, by decision; a network's entry lasts as long as the longest
    standing decision on it.  Indexed so that an answer costs what it changes, not
    what the book holds (a fleet's book may hold a million, polled every few
    seconds): each network's decisions, and a heap of when each lapses (put there
    by settle, after the set holds an answer's entries)."""

    decisions: dict[int, Decision]
    owners: dict[Prefix, int | set[int]]  # each network's decision (or ids, if several)
    expiries: list[tuple[int, int]]  # a heap of (until, id); ids gone since, skipped
    unsettled: list[dict[int, Decision]]  # inserted, not yet in the heap (settle)

    @classmethod
    def empty(cls) -> Book:
        return cls({}, {}, [], [])

    def entries(self, now: int, networks: Iterable[Prefix] | None = None) -> dict[Prefix, int]:
        """Each network held (of ``networks``, if given), until when (decisions lapsed
        by ``now`` left out)."""
        held: dict[Prefix, int] = {}
        decisions, owners = self.decisions, self.owners
        chosen = (
            owners.items()
            if networks is None
            else [(network, owners[network]) for network in networks if network in owners]
        )
        for network, ids in chosen:
            if isinstance(ids, int):
                until = decisions[ids].until
            else:
                until = max(decisions[i].until for i in ids)
            if until > now:
                held[network] = until
        return held

    def snapshot(self, answer: Answer, now: int) -> dict[Prefix, int]:
        """A startup answer: the book becomes what it says (as a delta would make an
        empty book); what the set must hold, whole (the caller makes the set equal
        to it)."""
        self.decisions, self.owners, self.expiries, self.unsettled = {}, {}, [], []
        self._insert({d.id: d for d in answer.new}, now)
        return self.entries(now)

    def delta(self, answer: Answer, now: int) -> Changes:
        """A later answer: deletions first (idempotent), then the new bans (a new one
        may replace one with its id; of two with one id, the later).  Only the
        networks they name can change, and only one that loses a decision can end
        sooner: those are looked up again; any other keeps what it held, or the
        longest of its new bans."""
        self.lapse(now)
        decisions, owners = self.decisions, self.owners
        newest = {d.id: d for d in answer.new}
        present = [i for i in (*answer.ended, *newest) if i in decisions]
        losing = {decisions[i].network for i in present}
        held = [d.network for d in newest.values() if d.network in owners]
        before = self.entries(now, losing.union(held))
        for ident in present:
            self._drop(ident)
        self._insert(newest, now)
        after = self.entries(now, losing)
        hold = {net: until for net, until in after.items() if before.get(net) != until}
        for decision in newest.values():  # any other network: held, or its longest new ban
            network, until = decision.network, decision.until
            if until > hold.get(network, before.get(network, 0)) and network not in losing:
                hold[network] = until
        return Changes(hold, frozenset(net for net in losing if net in before and net not in after))

    def lapse(self, now: int) -> None:
        """Forget decisions whose time has passed (their entries lapse by themselves)."""
        self.settle()
        heap, decisions = self.expiries, self.decisions
        while heap and heap[0][0] <= now:
            until, ident = heapq.heappop(heap)
            decision = decisions.get(ident)
            if decision is not None and decision.until == until:
                self._drop(ident)

    def networks(self, now: int) -> int:
        """How many networks the book holds now."""
        self.lapse(now)
        return len(self.owners)

    def _insert(self, new: dict[int, Decision], now: int) -> None:
        """Decisions whose ids the book does not hold, but those lapsed already."""
        decisions, owners = self.decisions, self.owners
        fresh = {i: d for i, d in new.items() if d.until > now}
        decisions.update(fresh)
        self.unsettled.append(fresh)
        alone = {d.network: i for i, d in fresh.items()}  # the usual: one a network
        if len(alone) == len(fresh) and owners.keys().isdisjoint(alone):
            owners.update(alone)
        else:
            for ident, decision in fresh.items():
                ids = owners.get(decision.network)
                if ids is None:
                    owners[decision.network] = ident
                elif isinstance(ids, int):
                    owners[decision.network] = {ids, ident}
                else:
                    ids.add(ident)

    def settle(self) -> None:
        """Put the expiries of the decisions inserted since in the heap.  Lapse does it
        first: the bouncer counts networks (lapse) once the set holds an answer's
        entries, which need not wait for the heap."""
        if not self.unsettled:
            return
        decisions, heap = self.decisions, self.expiries
        added = [(d.until, i) for fresh in self.unsettled for i, d in fresh.items()]
        self.unsettled = []
        if len(heap) + len(added) > 2 * len(decisions) + 1024:  # ids gone since: bounded
            heap[:] = [(d.until, d.id) for d in decisions.values()]
            heapq.heapify(heap)
        elif len(added) > len(heap) // 8:
            heap += added
            heapq.heapify(heap)
        else:
            for item in added:
                heapq.heappush(heap, item)

    def _drop(self, ident: int) -> None:
        decision = self.decisions.pop(ident, None)
        if decision is None:
            return
        ids = self.owners[decision.network]
        if isinstance(ids, int):
            del self.owners[decision.network]
            return
        ids.discard(ident)
        if len(ids) == 1:
            self.owners[decision.network] = next(iter(ids))
