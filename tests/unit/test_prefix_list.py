"""The bulk rule-file reader and PrefixList agree with parsing one line at a time."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alfwrapper.errors import AlfError
from alfwrapper.policy import prefix_list
from alfwrapper.policy.prefix_list import PrefixList, parse_rule_bytes, parse_rule_lines
from alfwrapper.policy.prefixes import Prefix, parse_prefix

pytestmark = pytest.mark.unit


def one_at_a_time(data: bytes) -> list[Prefix] | str:
    """The reference: every line through parse_prefix; an error as its one line."""
    try:
        return parse_rule_lines(data.decode().splitlines(), "f")
    except AlfError as err:
        return err.line()


def in_bulk(data: bytes) -> list[Prefix] | str:
    try:  # few=0: however short, the bulk path (a short file is read line by line)
        return list(parse_rule_bytes(data, "f", few=0))
    except AlfError as err:
        return err.line()


# Lines near the bulk path's edges: leading zeros, 4-digit octets, missing parts,
# host bits, lengths 0 and 33, comments and spaces, IPv6 and mapped addresses.
EDGES = [
    "192.0.2.0/24", "192.0.2.7", "0.0.0.0/0", "0.0.0.0", "255.255.255.255/32", "1.2.3.4/32",
    "10.0.0.0/8", "1.2.3.0/024", "01.2.3.4", "1.2.3.04", "1.2.3.256", "1.2.3.1000",
    "1.2.3", "1.2.3.4.5", "1.2.3.4/", "1.2.3.4/33", "1.2.3.4/3", "/24", ".1.2.3", "1..2.3",
    "1.2.3.4//8", "1.2.3.0/24/8", "1.2.3.4/0", "", "   ", "# note", "192.0.2.0/24 # office",
    " 192.0.2.9", "2001:db8::/32", "::ffff:192.0.2.0/120", "2001:db8::1", "1.2.3.4x", "x",
    "1.2.3.4 /24", "1.2.3.4/ 24", "1.2.3.4/240",
    # IPv6, in bulk since hex groups are read there too: "::" at each end and inside,
    # eight groups with and without "::", too many, a 5-digit group, mapped forms, scope
    # ids, host bits, lengths 0, 128, 129 and with a leading zero.
    "::", "::1", "1::", "1::2", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8",
    "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7:8", ":::", "1:::2", "::1::", "1:2::3:4::5",
    "12345::", "1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8:9", ":1::", ":1", "1:", "1::2:",
    "::ffff:c000:200/120", "::FFFF:C000:0/112", "::ffff:0:0/96", "::ffff:0:0/95",
    "::ffff:1.2.3.4", "fe80::1%eth0", "::/0", "::/00", "2001:db8::1/128", "2001:db8::1/64",
    "2001:db8::/064", "2001:db8::/129", "2001:db8::/", "2001:db8::/1/2", "2001:DB8:A::/48",
    "2001:db8:0:1::/64", "0:0:0:0:0:0:0:0/0", "2001:db8::/32 # note", " ::1", "::1/ 64",
    "::g", "::1.2", "1.2.3.4:5", "/64", "::/64/",
]  # fmt: skip
simple = st.text(alphabet="0123456789./", max_size=20)
hexes = st.text(alphabet="0123456789abcdefABCDEF:/", max_size=40)
lines = st.lists(st.one_of(st.sampled_from(EDGES), simple, hexes), max_size=30)


@pytest.mark.parametrize("line", EDGES)
def test_each_edge_alone_agrees(line: str) -> None:
    data = f"{line}\n".encode()
    assert in_bulk(data) == one_at_a_time(data)


@settings(max_examples=400, deadline=None)
@given(lines)
def test_bulk_and_line_by_line_agree(chosen: list[str]) -> None:
    data = "\n".join(chosen).encode()
    assert in_bulk(data) == one_at_a_time(data)


def test_ipv6_and_mapped_lines_are_read_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A million mixed rules parse fast only if IPv6 lines skip the line-by-line parser:
    every hex form of an address, a CIDR and a mapped prefix is read in bulk; a dotted
    IPv4 tail, a comment or an error goes one line at a time."""
    one_by_one: list[str] = []
    line_by_line = prefix_list.parse_rule_lines

    def spy(texts: list[str], origin: str, first: int = 1) -> list[Prefix]:
        one_by_one.extend(texts)
        return line_by_line(texts, origin, first)

    monkeypatch.setattr(prefix_list, "parse_rule_lines", spy)
    bulk = ["2001:db8::/32", "::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::",
            "::ffff:c000:200/120", "2001:DB8:A::/48", "::/0", "192.0.2.0/24"]  # fmt: skip
    slow = ["::ffff:192.0.2.0/120", "2001:db8::/48 # note", "2001:db8::/064"]
    data = "\n".join(bulk + slow).encode()
    assert in_bulk(data) == [parse_prefix(t.split("#")[0]) for t in bulk + slow]
    assert one_by_one == slow


@pytest.mark.parametrize(
    ("data", "bulk"),
    [
        (b"192.0.2.0/24\n" * prefix_list.SMALL_RULES, False),
        (b"192.0.2.0/24\n" * (prefix_list.SMALL_RULES + 1), True),
        (b"192.0.2.0/24\n" * (prefix_list.SMALL_RULES - 1) + b"192.0.2.0/24", False),
        (b"", False),
        # few lines, but longer than SMALL_RULES lines can be: in bulk, chunk by chunk
        (b"# " + b"x" * 300_000 + b"\n192.0.2.0/24\n", True),
        (b"1" * ((prefix_list.LINE_LIMIT + 1) * prefix_list.SMALL_RULES + 1), True),
    ],
)
def test_a_short_file_is_read_one_line_at_a_time(
    monkeypatch: pytest.MonkeyPatch, data: bytes, bulk: bool
) -> None:
    """At most SMALL_RULES lines, and no longer than so many lines can be, are read
    without numpy; anything else in bulk, however few its lines."""
    chunks: list[int] = []
    in_chunks = prefix_list._parse_chunk

    def spy(chunk: bytes, first: int, origin: str) -> tuple[PrefixList, int]:
        chunks.append(first)
        return in_chunks(chunk, first, origin)

    monkeypatch.setattr(prefix_list, "_parse_chunk", spy)
    assert in_bulk(data) == one_at_a_time(data)
    chunks.clear()
    try:
        parse_rule_bytes(data, "f")
    except AlfError:
        pass
    assert bool(chunks) == bulk


@pytest.mark.parametrize("ending", ["\r\n", "\r", "\x0c", "\u2028"])
def test_other_line_breaks_keep_their_line_numbers(ending: str) -> None:
    data = ending.join(["192.0.2.0/24", "# ok", "198.51.100.0/24", "1.2.3.5/24"]).encode()
    assert in_bulk(data) == one_at_a_time(data)
    assert "f:4:" in str(in_bulk(data))


def test_chunks_keep_order_and_line_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefix_list, "_CHUNK", 64)  # many chunks, cut mid-line
    rng = random.Random(7)
    texts = [f"198.51.{rng.randrange(256)}.{rng.randrange(256)}" for _ in range(300)]
    texts[150] = "2001:db8::/48  # among them"
    data = "\n".join(texts).encode()
    assert in_bulk(data) == one_at_a_time(data)
    texts[271] = "198.51.100.300"
    assert in_bulk("\n".join(texts).encode()) == one_at_a_time("\n".join(texts).encode())
    assert "f:272:" in str(in_bulk("\n".join(texts).encode()))


def test_prefix_list_behaves_as_a_sequence() -> None:
    found = [parse_prefix(t) for t in ("192.0.2.0/24", "2001:db8::/32", "10.0.0.1", "::/0")]
    listed = PrefixList.of(found)
    assert len(listed) == 4 and list(listed) == found and listed[1] == found[1]
    assert list(listed[1:3]) == found[1:3]
    assert parse_prefix("10.0.0.1") in listed and parse_prefix("10.0.0.2") not in listed
    assert listed == PrefixList.of(list(found)) and hash(listed) == hash(PrefixList.of(found))
    assert listed != PrefixList.of(found[:3])
    assert PrefixList.concat([listed, (), found[:1]]) == found + found[:1]
    assert PrefixList.concat([(), listed]) is listed  # no copy of the only part
    v6 = 0x20010DB8 << 96 | 5
    assert list(listed.covering(6, v6)) == [found[1], found[3]]
    assert list(listed.covering(4, 0xC0000207)) == [found[0]]
    assert list(listed.of_family(4)) == [found[0], found[2]]


def test_a_list_of_prefix_objects_answers_as_its_columns_do() -> None:
    """A list made from Prefix objects answers from them, without numpy, until its
    columns are asked for: the same covering, families, equality and hash as a list
    made from columns, on seeded random prefixes and addresses near them."""
    rng = random.Random(2611)
    for _ in range(200):
        found = []
        for _ in range(rng.randint(0, 12)):
            family = rng.choice((4, 6))
            width = 32 if family == 4 else 128
            found.append(_prefix(family, rng.getrandbits(width), rng.randint(0, width)))
        lazy = PrefixList.of(found)
        columns = PrefixList.concat([PrefixList.of(found[:1]), PrefixList.of(found[1:])])
        columns.family  # noqa: B018  (its columns made)
        assert lazy._columns is None
        for p in found or [_prefix(4, 0, 0)]:
            width = 32 if p.family == 4 else 128
            for address in (
                p.value,
                p.value | ((1 << (width - p.length)) - 1),
                p.value ^ 1,
                rng.getrandbits(width),
            ):
                want = list(columns.covering(p.family, address))
                assert list(lazy.covering(p.family, address)) == want
        assert [list(lazy.of_family(f)) for f in (4, 6)] == [
            list(columns.of_family(f)) for f in (4, 6)
        ]
        assert lazy._columns is None  # all of the above without numpy
        assert lazy == columns and hash(lazy) == hash(columns) and list(lazy) == found


def _prefix(family: int, value: int, length: int) -> Prefix:
    width = 32 if family == 4 else 128
    return Prefix(family, value >> (width - length) << (width - length), length)


prefixes = st.one_of(
    st.builds(_prefix, st.just(4), st.integers(0, 2**32 - 1), st.integers(0, 32)),
    st.builds(_prefix, st.just(6), st.integers(0, 2**128 - 1), st.integers(0, 128)).filter(
        lambda p: not (p.value >> 32 == 0xFFFF and p.length >= 96)  # mapped: IPv4 rules
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(prefixes, max_size=40))
def test_packed_rules_come_back_as_they_went(chosen: list[Prefix]) -> None:
    """The loader's compact form: the same set of prefixes back, IPv4 and IPv6."""
    back = PrefixList.unpacked(PrefixList.of(chosen).packed(), 2_000_000)
    assert sorted(map(str, back)) == sorted(map(str, chosen))


def _packed(n4: int, n6: int, body: bytes) -> bytes:
    return zlib.compress(struct.pack("<II", n4, n6) + body)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (_packed(1, 0, bytes([33]) + (0).to_bytes(4, "little")), "width"),
        (_packed(1, 0, bytes([24]) + (0xC0000205).to_bytes(4, "little")), "host bits"),
        (
            _packed(
                0, 1, bytes([64]) + (1 << 63).to_bytes(8, "little") + (1).to_bytes(8, "little")
            ),
            "host bits",
        ),
        (
            _packed(0, 1, bytes([128]) + bytes(8) + (0xFFFF_C0000201).to_bytes(8, "little")),
            "IPv4-mapped",
        ),
        (_packed(2, 0, bytes([32])), "differ"),  # fewer bytes than the counts say
        (_packed(0, 0, b"\0" * 64), "differ"),  # more
        (_packed(3_000_000, 0, b""), "more than"),
        (zlib.compress(b"\0" * (64 << 20)), "differ"),  # a bomb: stops at what counts allow
        (b"not zlib", "zlib"),
        (_packed(0, 0, b"")[:-3], "differ"),
        (_packed(0, 0, b"") + b"junk", "differ"),  # bytes after the stream
        (_packed(1, 0, bytes([32]) + bytes(4)) + b"junk", "differ"),
    ],
)
def test_packed_rules_are_checked_like_text(data: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        PrefixList.unpacked(data, 2_000_000)
