"""CrowdSec's decision stream, read strictly and kept by decision: Go's duration text,
bans of addresses and ranges only, overlapping decisions, deletions that come twice,
startup snapshots; and a set driven only by the changes the book hands out always
holds what the book says."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from alfwrapper.errors import EX_PROTOCOL, AlfError
from alfwrapper.policy import crowdsec
from alfwrapper.policy.crowdsec import Book, Changes, duration_ns, read_answer
from alfwrapper.policy.prefixes import Prefix, parse_prefix

pytestmark = pytest.mark.unit

S = 10**9


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0s", 0),
        ("0", 0),
        ("1s", S),
        ("-7.34s", -7_340_000_000),
        ("3h59m58.123456789s", (3 * 3600 + 59 * 60 + 58) * S + 123_456_789),
        ("72h3m0.5s", (72 * 3600 + 180) * S + S // 2),
        ("1.5ms", 1_500_000),
        ("500us", 500_000),
        ("2µs", 2_000),
        ("7ns", 7),
        ("4h", 4 * 3600 * S),
    ],
)
def test_go_durations(text: str, ns: int) -> None:
    assert duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "3x", "h", "1h 2m", "--1s", "1.2.3s", "s1", "1s2", None, 5])
def test_anything_else_is_not_a_duration(text: Any) -> None:
    with pytest.raises(ValueError, match="not Go's duration text"):
        duration_ns(text)


def ban(
    ident: int, value: str, duration: str = "4h", scope: str = "Ip", kind: str = "ban"
) -> dict[str, Any]:
    return {"id": ident, "origin": "cscli", "type": kind, "scope": scope, "value": value,
            "duration": duration, "scenario": "manual"}  # fmt: skip


def test_an_answer_is_read_whole() -> None:
    answer = read_answer(
        {
            "new": [
                ban(1, "192.0.2.7"),
                ban(2, "198.51.100.77/24", scope="Range"),  # host bits: the LAPI keeps them
                ban(3, "2001:db8::1", scope="ip"),
                ban(4, "::ffff:203.0.113.9"),  # a mapped address is the IPv4 one
                ban(5, "192.0.2.8", kind="captcha"),
                ban(6, "AS64496", scope="AS"),
                ban(7, "192.0.2.9", duration="-1s"),  # over already
            ],
            "deleted": None,  # 1.4.6's empty list
        },
        now=100,
    )
    assert [(d.id, str(d.network), d.until) for d in answer.new] == [
        (1, "192.0.2.7/32", 100 + 4 * 3600 * S),
        (2, "198.51.100.0/24", 100 + 4 * 3600 * S),
        (3, "2001:db8::1/128", 100 + 4 * 3600 * S),
        (4, "203.0.113.9/32", 100 + 4 * 3600 * S),
    ]
    assert answer.ended == (7,) and answer.skipped == 2


@pytest.mark.parametrize("answer", [[], {"new": {}}, {"deleted": "x"}, "null"])
def test_a_malformed_answer_is_one_error_and_nothing_of_it_is_used(answer: Any) -> None:
    with pytest.raises(AlfError) as err:
        read_answer(answer, now=0)
    assert err.value.exit_code == EX_PROTOCOL
    assert err.value.line().startswith("alfwrapper: the CrowdSec LAPI's decisions stream: ")


@pytest.mark.parametrize(
    "bad",
    [
        ban(1, "192.0.2.300"),
        ban(True, "192.0.2.1"),  # a JSON true is not an id
        ban(1, "192.0.2.1", duration="soon"),
        ban(1, "x" * 100),
        "192.0.2.1",
        {"value": "192.0.2.1"},
    ],
)
def test_a_malformed_decision_is_left_out_and_the_others_are_read(bad: Any) -> None:
    """One decision that cannot be read must not keep every other ban out."""
    answer = read_answer({"new": [bad, ban(9, "198.51.100.9")], "deleted": None}, now=0)
    assert [str(d.network) for d in answer.new] == ["198.51.100.9/32"]
    assert answer.malformed == 1 and answer.ended == ()
    # A deletion needs its id alone; one without is left out (its entry lapses).
    answer = read_answer({"deleted": [{"value": "192.0.2.1"}, "x", {"id": 3}]}, now=0)
    assert answer.ended == (3,) and answer.malformed == 2


_VALUES = st.sampled_from(
    [
        "192.0.2.7",
        "198.51.100.0/24",
        "2001:db8::1",
        "::ffff:192.0.2.9",
        "192.0.2.300",
        "1.2.3",
        " 192.0.2.1",
        "192.0.2.1 ",
        "x" * 70,
        "",
    ]
)
_DURATIONS = st.sampled_from(["4h", "3h59m58.123456789s", "0s", "-1s", "-0.5s", "1.5ms",
                              "9" * 12 + "h", "999999999999h0m0s", "876000h0m0s",
                              "876000h0m0.000000001s", "-3h0m1s", "0h0m0s", "1m", "59.1s",
                              "2m3.25s", "1h0m0.5s", "0.000000001s", "1h2", "soon",
                              ""])  # fmt: skip
# Mostly what the LAPI sends (a ban on an address, its own duration form), the
# short way's edges among them; and any other decision.
_USUAL = st.fixed_dictionaries(
    {"id": st.integers(0, 9), "type": st.just("ban"), "scope": st.just("Ip"),
     "value": st.sampled_from(["192.0.2.7", "0.0.0.0", "255.255.255.255", "192.0.2.300",
                               "192.0.2.7\x00", "\ud800", "::1\x00",
                               "2001:db8::1", "::", "::ffff:192.0.2.9", "::ffff:0:1",
                               "2001:db8::/32", "192.0.2.0/24", "1.2.3"]),
     "duration": _DURATIONS}
)  # fmt: skip
_ANY = st.fixed_dictionaries(
    {
        "id": st.one_of(st.integers(0, 9), st.booleans(), st.just("1")),
        "type": st.sampled_from(["ban", "Ban", "captcha", None]),
        "scope": st.sampled_from(["Ip", "ip", "Range", "range", "AS", 7]),
        "value": st.one_of(_VALUES, st.integers()),
        "duration": st.one_of(_DURATIONS, st.none(), st.integers()),
    }
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_USUAL, _ANY, st.just("x"), st.just({})), max_size=12))
@example([{"id": 1, "type": "ban", "scope": "Ip", "value": "192.0.2.7", "duration": "59.1s"}])
@example([{"id": 1, "type": "ban", "scope": "Ip", "value": "192.0.2.7\x00", "duration": "1s"}])
def test_the_short_way_reads_as_every_decision_is_read(items: list[Any]) -> None:
    """read_answer takes a ban on one address the short way (_usual); it must read it as
    crowdsec._decision reads every decision, whatever the others around it are."""
    got = read_answer({"new": items}, now=7)
    usual = crowdsec._usual
    try:
        crowdsec._usual = lambda items, now: [None] * len(items)  # all the long way
        assert got == read_answer({"new": items}, now=7)
    finally:
        crowdsec._usual = usual


def test_an_ip_decision_on_a_range_and_a_ban_for_ages() -> None:
    answer = read_answer(
        {"new": [ban(1, "192.0.2.0/24", scope="Ip"), ban(2, "192.0.2.1", duration="9" * 12 + "h")]},
        now=5,
    )
    assert str(answer.new[0].network) == "192.0.2.0/24"  # the range it names
    assert answer.new[1].until == 5 + crowdsec.LONGEST_NS  # fits the map's u64


def test_overlapping_decisions_and_repeated_deletions() -> None:
    book, net = Book.empty(), parse_prefix("192.0.2.7")
    got = book.snapshot(read_answer({"new": [ban(1, "192.0.2.7", "1h")]}, now=0), now=0)
    assert got == {net: 3600 * S}
    got = book.delta(read_answer({"new": [ban(2, "192.0.2.7", "2h")]}, now=0), now=0)
    assert got == Changes({net: 7200 * S}, frozenset())  # extended to the longest
    deleted = {"deleted": [ban(2, "192.0.2.7", "-1s")]}
    got = book.delta(read_answer(deleted, now=S), now=S)
    assert got == Changes({net: 3600 * S}, frozenset())  # back to the one that stands
    assert book.delta(read_answer(deleted, now=2 * S), now=2 * S) == Changes({}, frozenset())
    got = book.delta(read_answer({"deleted": [ban(1, "192.0.2.7", "-1s")]}, now=3 * S), now=3 * S)
    assert got == Changes({}, frozenset({net}))


def test_a_decision_replaced_by_one_lapsed_by_the_time_it_is_applied_is_gone() -> None:
    book, net = Book.empty(), parse_prefix("192.0.2.7")
    book.snapshot(read_answer({"new": [ban(1, "192.0.2.7", "1h")]}, now=0), now=0)
    answer = read_answer({"new": [ban(1, "192.0.2.7", "1s")]}, now=0)
    assert book.delta(answer, now=2 * S) == Changes({}, frozenset({net}))
    assert book.decisions == {}


def test_a_decision_extended_outlives_its_first_end() -> None:
    """A decision given again with a longer time (one id) stands past its first end:
    the heap's entry for that end is stale, and lapse skips it."""
    book, net = Book.empty(), parse_prefix("192.0.2.7")
    book.snapshot(read_answer({"new": [ban(1, "192.0.2.7", "1h")]}, now=0), now=0)
    book.delta(read_answer({"new": [ban(1, "192.0.2.7", "2h")]}, now=0), now=0)
    assert book.networks(5400 * S) == 1
    assert book.entries(5400 * S) == {net: 7200 * S}
    assert book.networks(7200 * S) == 0


def test_one_network_under_many_decisions() -> None:
    """A network with many decisions (a LAPI may send any number on one address)
    stands until the last of them ends or goes."""
    book, net = Book.empty(), parse_prefix("192.0.2.7")
    many = [ban(i, "192.0.2.7", f"{i}s") for i in range(1, 20001)]
    assert book.snapshot(read_answer({"new": many}, now=0), now=0) == {net: 20000 * S}
    gone = {"deleted": [ban(i, "192.0.2.7", "-1s") for i in range(10001, 20001)]}
    assert book.delta(read_answer(gone, now=0), now=0) == Changes({net: 10000 * S}, frozenset())
    assert book.networks(9999 * S) == 1 and book.entries(9999 * S) == {net: 10000 * S}
    assert book.networks(10000 * S) == 0


def test_an_end_in_the_new_list_ends_what_came_before_it_alone() -> None:
    """The new list in order: a decision of one id that has ended ends the ban before
    it, not the one after it; a startup reads it as a delta on an empty book."""
    net = parse_prefix("192.0.2.7")
    for first, then, stands in (("1h", "-1s", False), ("-1s", "1h", True)):
        answer = read_answer(
            {"new": [ban(5, "192.0.2.7", first), ban(5, "192.0.2.7", then)]}, now=0
        )
        book = Book.empty()
        got = book.snapshot(answer, now=0)
        assert got == ({net: 3600 * S} if stands else {}), (first, then)
        book = Book.empty()
        book.snapshot(read_answer({"new": [ban(5, "192.0.2.7", "2h")]}, now=0), now=0)
        book.delta(answer, now=0)
        assert book.entries(0) == ({net: 3600 * S} if stands else {}), (first, then)


def test_an_id_past_pythons_digits_is_one_malformed_decision() -> None:
    """json refuses a whole text with an integer of more than 4,300 digits: that one
    decision is malformed, and the others are read."""
    import json  # noqa: PLC0415

    data = json.dumps({"new": [ban(1, "192.0.2.7"), ban(2, "192.0.2.8")]}).replace(
        '"id": 1,', '"id": ' + "9" * 5000 + ","
    )
    answer = read_answer(crowdsec.load_answer(data.encode()), now=0)
    assert [d.id for d in answer.new] == [2] and answer.malformed == 1


def test_a_delta_holds_the_longest_of_its_new_bans_on_one_network() -> None:
    book, net = Book.empty(), parse_prefix("192.0.2.7")
    book.snapshot(read_answer({"new": [ban(1, "192.0.2.7", "1h")]}, now=0), now=0)
    answer = {"new": [ban(2, "192.0.2.7", "3h"), ban(3, "192.0.2.7", "2h")]}
    assert book.delta(read_answer(answer, now=0), now=0) == Changes(
        {net: 3 * 3600 * S}, frozenset()
    )


def test_a_book_of_decisions_that_come_and_go_stays_bounded() -> None:
    """Decisions deleted before their time leave their expiries in the heap, until
    there are more of them than decisions: then it is rebuilt."""
    book = Book.empty()
    book.snapshot(read_answer({"new": [ban(1, "192.0.2.1", "1h")]}, now=0), now=0)
    for ident in range(2, 5000):
        book.delta(read_answer({"new": [ban(ident, "192.0.2.2", "1h")]}, now=0), now=0)
        book.delta(read_answer({"deleted": [ban(ident, "192.0.2.2", "-1s")]}, now=0), now=0)
    assert len(book.expiries) <= 2 * len(book.decisions) + 1025
    assert book.entries(0) == {parse_prefix("192.0.2.1"): 3600 * S}


def test_a_startup_answer_replaces_the_book() -> None:
    book = Book.empty()
    book.snapshot(read_answer({"new": [ban(1, "192.0.2.1"), ban(2, "192.0.2.2")]}, now=0), now=0)
    got = book.snapshot(
        read_answer({"new": [ban(2, "192.0.2.2"), ban(3, "192.0.2.3")]}, now=0), now=0
    )  # the set is made to hold this and nothing else (sets.assign)
    assert got == {parse_prefix(a): 4 * 3600 * S for a in ("192.0.2.2", "192.0.2.3")}
    assert book.entries(0) == got


DECISIONS = st.lists(
    st.tuples(
        st.sampled_from(["new", "new", "deleted", "over"]),  # over: "new", 0 s or less left
        st.integers(1, 6),  # decision id
        st.sampled_from(["192.0.2.1", "192.0.2.2", "2001:db8::1", "198.51.100.0/24"]),
        st.integers(1, 50),  # seconds
    ),
    max_size=5,
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["delta", "startup"]), DECISIONS),
        st.tuples(st.just("wait"), st.integers(1, 50)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_a_set_driven_by_the_changes_holds_what_the_book_holds(ops: list[Any]) -> None:
    """The set is only ever told the changes (as the bouncer tells the kernel); after
    every answer, its entries that have not lapsed are the book's, with their times,
    and the book holds the decisions that stand, none past its time: an answer's
    deletions first, then its new decisions in order, each read alone (a later one
    with an id replaces an earlier, and one that has ended ends it); a startup's on
    an empty book."""
    book, now = Book.empty(), 0
    held: dict[Prefix, int] = {}
    standing: dict[int, crowdsec.Decision] = {}
    for op, what in ops:
        if op == "wait":
            now += what * S
            continue
        answer: dict[str, list[Any]] = {"new": [], "deleted": []}
        for kind, ident, value, seconds in what:
            scope = "Range" if "/" in value else "Ip"
            duration = f"-{seconds}s" if kind != "new" else f"{seconds}s"
            answer["deleted" if kind == "deleted" else "new"].append(
                ban(ident, value, duration, scope)
            )
        read = read_answer(answer, now)
        if op == "startup":  # the set is made equal to the book (sets.assign)
            held = dict(book.snapshot(read, now))
            standing = {}
        else:
            changes = book.delta(read, now)
            for net in changes.remove:
                held.pop(net, None)
            held.update(changes.hold)
        for item in answer["deleted"]:
            standing.pop(item["id"], None)
        for item in answer["new"]:
            alone = read_answer({"new": [item]}, now)
            for ident in alone.ended:
                standing.pop(ident, None)
            for decision in alone.new:
                standing[decision.id] = decision
        standing = {i: d for i, d in standing.items() if d.until > now}
        assert book.decisions == standing
        owners: dict[Prefix, set[int]] = {}
        for decision in standing.values():
            owners.setdefault(decision.network, set()).add(decision.id)
        assert {
            net: {ids} if isinstance(ids, int) else set(ids) for net, ids in book.owners.items()
        } == owners
        assert not any(isinstance(ids, set) and len(ids) < 2 for ids in book.owners.values())
        unsettled = {(d.until, i) for fresh in book.unsettled for i, d in fresh.items()}
        assert {(d.until, d.id) for d in standing.values()} <= set(book.expiries) | unsettled
        in_force = {net: until for net, until in held.items() if until > now}
        assert in_force == book.entries(now)
        assert book.networks(now) == len(in_force)


# -- the bouncer's config file (lifecycle/bouncer.py) --------------------------


def config_file(tmp_path, text: str, key: str = "k3y\n"):  # type: ignore[no-untyped-def]
    (tmp_path / "key").write_text(key)
    (tmp_path / "key").chmod(0o600)  # as docs/sets.md tells: others may not read it
    path = tmp_path / "crowdsec.toml"
    path.write_text(text.replace("KEY", str(tmp_path / "key")))
    return str(path)


def test_a_config_with_every_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from alfwrapper.lifecycle.bouncer import read_config  # noqa: PLC0415

    config = read_config(config_file(tmp_path, (
        'lapi-url = "http://192.0.2.10:8080"\napi-key-file = "KEY"\nset = "fleet"\n'
        'scopes = ["ip"]\npoll-interval = 2.5\ntimeout = 60\nmetrics-file = "/run/x.json"\n'
        "insecure-http = true\nwidest-ipv4 = 16\nwidest-ipv6 = 48\n"
    )))  # fmt: skip
    assert (config.url, config.key, config.set, config.scopes) == (
        "http://192.0.2.10:8080/",
        "k3y",
        "fleet",
        ("ip",),
    )
    assert (config.interval, config.timeout, config.metrics) == (2.5, 60.0, "/run/x.json")
    assert config.widest == (16, 48)
    assert "k3y" not in repr(config)  # the key is never printed
    defaults = read_config(config_file(tmp_path, 'api-key-file = "KEY"\n'))
    assert defaults.widest == (8, 32)


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ('api-key-file = "KEY"\nextra = 1\n', "k", "unknown key 'extra'"),
        ('lapi-url = "ftp://x"\napi-key-file = "KEY"\n', "k", "is not an http(s) URL"),
        ("set = 1\n", "k", "has no api-key-file"),
        ('api-key-file = "KEY"\n', "\n", "holds no key"),
        ('api-key-file = "KEY"\nset = "a.b"\n', "k", "is not a set name"),
        ('api-key-file = "KEY"\nscopes = ["country"]\n', "k", "are not a list of ip and range"),
        ('api-key-file = "KEY"\npoll-interval = 0\n', "k", "poll-interval '0' is out of range"),
        ('api-key-file = "KEY"\npoll-interval = true\n', "k", "out of range"),
        ('api-key-file = "KEY"\nmetrics-file = "m.json"\n', "k", "not an absolute path"),
        ("lapi-url = [\n", "k", "is not TOML"),
        (
            'lapi-url = "http://192.0.2.10:8080"\napi-key-file = "KEY"\n',
            "k",
            "'http://192.0.2.10:8080' would send the key in clear to another host",
        ),
        ('lapi-url = "http://lapi.example.org/"\napi-key-file = "KEY"\n', "k", "in clear"),
        ('lapi-url = "http://127.0.0.1.example.org/"\napi-key-file = "KEY"\n', "k", "in clear"),
        (
            'lapi-url = "http://192.0.2.10/"\ninsecure-http = "yes"\napi-key-file = "KEY"\n',
            "k",
            "insecure-http 'yes' is not true or false",
        ),
        ('api-key-file = "KEY"\nwidest-ipv4 = 0\n', "k", "widest-ipv4 '0' is not a prefix length"),
        ('api-key-file = "KEY"\nwidest-ipv6 = 129\n', "k", "widest-ipv6 '129' is not a prefix"),
        ('api-key-file = "KEY"\nwidest-ipv4 = true\n', "k", "is not a prefix length 1 to 32"),
    ],
)
def test_config_mistakes(tmp_path, text: str, key: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    from alfwrapper.lifecycle.bouncer import read_config  # noqa: PLC0415

    with pytest.raises(AlfError) as caught:
        read_config(config_file(tmp_path, text, key))
    assert needle in str(caught.value) and caught.value.exit_code == 78, caught.value


@given(
    st.integers(0, 10**6),
    st.integers(0, 59),
    st.integers(0, 59),
    st.text("0123456789", max_size=9),
    st.booleans(),
    st.integers(0, 2),
)
def test_the_lapis_form_reads_as_the_general_way_reads_it(
    hours: int, minutes: int, seconds: int, fraction: str, minus: bool, shape: int
) -> None:
    """duration_ns's one-match reading of what the LAPI writes, held to the general one."""
    from alfwrapper.policy.crowdsec import _general_duration_ns  # noqa: PLC0415

    tail = f"{seconds}.{fraction}s" if fraction else f"{seconds}s"
    text = ("-" if minus else "") + (
        f"{hours}h{minutes}m{tail}" if shape == 0 else f"{minutes}m{tail}" if shape == 1 else tail
    )
    assert duration_ns(text) == _general_duration_ns(text)


@settings(max_examples=2000)
@given(st.text("0123456789hms.-", max_size=16))
@example("59m58.1s")  # a run of digits that is not hours: minutes, then seconds
@example("0.s")  # a dot without digits: 3.11.2's possessive (?:...)?+ took it
@example("1h2m" + "9" * 3 + "s")  # seconds too long: nothing to give back
def test_the_lapis_form_reads_any_text_as_the_general_way_or_not_at_all(text: str) -> None:
    """The short reader's possessive pattern finds what the plain one finds (its
    specification: the LAPI's form), and reads it as the general way does."""
    from alfwrapper.policy.crowdsec import _general_duration_ns, _lapi_form  # noqa: PLC0415

    plain = r"-?(?:[0-9]{1,12}h)?(?:[0-9]{1,2}m)?[0-9]{1,2}(?:\.[0-9]{1,9})?s"
    got = _lapi_form(text)
    assert (got is not None) == (re.fullmatch(plain, text) is not None), text
    if got is not None:
        assert got == _general_duration_ns(text), text


@given(st.integers(0, 2**32 - 1) | st.integers(2**32, 2**128 - 1), st.booleans())
def test_an_address_reads_as_ipaddress_reads_it(value: int, mapped: bool) -> None:
    """The inet_pton reading of an Ip decision's value, held to ipaddress's."""
    import ipaddress  # noqa: PLC0415

    from alfwrapper.policy.crowdsec import _network  # noqa: PLC0415

    if value < 2**32 and mapped:
        text = f"::ffff:{ipaddress.IPv4Address(value)}"
    else:
        text = str(ipaddress.ip_address(value if value >= 2**32 else value))
    network = ipaddress.ip_network(text)
    if isinstance(network, ipaddress.IPv6Network) and network.network_address.ipv4_mapped:
        expected = Prefix(4, int(network.network_address.ipv4_mapped), 32)
    else:
        expected = Prefix(network.version, int(network.network_address), network.prefixlen)
    assert _network("ip", text) == expected


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8080/", "http://127.3.2.1/", "http://[::1]:8080", "http://localhost:8080/",
     "http://LOCALHOST./", "https://192.0.2.10:8080/", "https://lapi.example.org/"],
)  # fmt: skip
def test_a_key_in_clear_stays_on_this_host(tmp_path, url: str) -> None:  # type: ignore[no-untyped-def]
    """http:// only to loopback, where the key crosses no network; https:// anywhere."""
    from alfwrapper.lifecycle.bouncer import read_config  # noqa: PLC0415

    assert read_config(config_file(tmp_path, f'lapi-url = "{url}"\napi-key-file = "KEY"\n')).key
    with pytest.raises(AlfError) as caught:
        read_config(
            config_file(tmp_path, 'lapi-url = "http://192.0.2.10/"\napi-key-file = "KEY"\n')
        )
    assert caught.value.hint == "use https://, or write insecure-http = true to send it anyway"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o610])
def test_a_key_others_may_use_is_refused(tmp_path, mode: int) -> None:  # type: ignore[no-untyped-def]
    """As ssh refuses a private key: any access for group or others (78, chmod 600)."""
    from alfwrapper.lifecycle.bouncer import read_config  # noqa: PLC0415

    path = config_file(tmp_path, 'api-key-file = "KEY"\n')
    (tmp_path / "key").chmod(mode)
    for key_file, need_key in (("", True), (str(tmp_path / "key"), False)):  # --prepare too
        with pytest.raises(AlfError) as caught:
            read_config(path, key_file, need_key=need_key)
        assert caught.value.exit_code == 78, caught.value
        assert f"is open to others (mode {mode:04o}) (chmod 600 {tmp_path}/key" in str(
            caught.value.line()
        ), caught.value.line()
    (tmp_path / "key").chmod(0o400)
    assert read_config(path).key == "k3y"


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A system.posix_acl_access value (linux/posix_acl_xattr.h): version 2, then
    (tag, permissions, id) entries in tag order."""
    import struct  # noqa: PLC0415

    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_a_key_shared_by_an_acl_is_read_as_the_kernel_reads_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """systemd hands the key over as root's file, 0400, with an ACL entry giving the
    service's user read (the group bits then show the ACL's mask: 0440): accepted.
    An ACL entry for anyone else is refused."""
    import os  # noqa: PLC0415

    from alfwrapper.lifecycle.bouncer import read_config  # noqa: PLC0415

    path = config_file(tmp_path, 'api-key-file = "KEY"\n')
    key, me, nobody = str(tmp_path / "key"), os.geteuid(), 65534
    (tmp_path / "key").chmod(0o400)
    none = 0xFFFFFFFF  # the id of entries that name none
    credential = _acl((1, 4, none), (2, 4, me), (4, 0, none), (0x10, 4, none), (0x20, 0, none))
    try:
        os.setxattr(key, "system.posix_acl_access", credential)
    except OSError as err:
        pytest.skip(f"no POSIX ACLs here: {err}")
    assert os.stat(key).st_mode & 0o777 == 0o440
    assert read_config(path).key == "k3y"
    other = _acl((1, 4, none), (2, 4, nobody), (4, 0, none), (0x10, 4, none), (0x20, 0, none))
    os.setxattr(key, "system.posix_acl_access", other)
    with pytest.raises(AlfError, match="is open to others"):
        read_config(path)


def test_bans_wider_than_the_limit_are_left_out_and_slash_zero_always() -> None:
    """/8 (IPv4) and /32 (IPv6) by default; /0 whatever the limit says; a wide one ends
    an earlier decision with its id."""
    answer = {
        "new": [
            ban(1, "192.0.2.7"),
            ban(2, "0.0.0.0/0", scope="Range"),
            ban(3, "::/0", scope="Range"),
            ban(4, "0.0.0.0/0"),  # an Ip decision on a range is read as one
            ban(5, "10.0.0.0/7", scope="Range"),
            ban(6, "10.0.0.0/8", scope="Range"),
            ban(7, "2001:db8::/31", scope="Range"),
            ban(8, "2001:db8::/32", scope="Range"),
            ban(9, "198.51.100.0/24", scope="Range"),
            ban(9, "128.0.0.0/1", scope="Range"),  # replaces the /24 of its id
        ],
        "deleted": [],
    }
    read = read_answer(answer, now=0)
    assert [str(d.network) for d in read.new] == ["192.0.2.7/32", "10.0.0.0/8", "2001:db8::/32"]
    assert [str(p) for p in read.too_wide] == [
        "0.0.0.0/0",
        "::/0",
        "0.0.0.0/0",
        "10.0.0.0/7",
        "2001:db8::/31",
        "128.0.0.0/1",
    ]
    assert set(read.ended) == {2, 3, 4, 5, 7, 9}
    book = Book.empty()
    assert {str(net) for net in book.snapshot(read, 0)} == {
        "192.0.2.7/32",
        "10.0.0.0/8",
        "2001:db8::/32",
    }
    for widest in ((1, 1), (0, 0), (-5, -5)):  # no limit lets /0 through
        loose = read_answer(answer, now=0, widest=widest)
        assert [str(p) for p in loose.too_wide] == ["0.0.0.0/0", "::/0", "0.0.0.0/0"], widest
        assert "128.0.0.0/1" in {str(d.network) for d in loose.new}


def test_the_metrics_file_is_read_only_if_regular_and_small(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Root reads what the bouncer's user may plant: a link, a FIFO (waited on for ever
    by a plain open; or holding what looks like counters), or a file past the limit
    is nothing."""
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from alfwrapper.lifecycle.bouncer import METRICS_LIMIT, read_metrics  # noqa: PLC0415

    counters = json.dumps({"polls": 7})
    real = tmp_path / "real.json"
    real.write_text(counters)
    assert read_metrics(str(real)) == {"polls": 7}
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert read_metrics(str(link)) is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)

    def too_slow(signum: int, frame: object) -> None:
        pytest.fail("read_metrics waited on a FIFO")  # not an OSError: read_metrics catches those

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        assert read_metrics(str(fifo)) is None  # no writer: a blocking open waits for ever
        # Counters in the pipe, its writer gone, kept alive by a reader: readable to the end.
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(writer, counters.encode())
            os.close(writer)
            assert read_metrics(str(fifo)) is None
        finally:
            os.close(reader)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    big = tmp_path / "big.json"  # whitespace after JSON is JSON: only the size is wrong
    big.write_text(counters.ljust(METRICS_LIMIT + 1))
    assert read_metrics(str(big)) is None
    big.write_text(counters.ljust(METRICS_LIMIT))
    assert read_metrics(str(big)) == {"polls": 7}
