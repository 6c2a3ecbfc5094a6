"""Parsing of CIDRs, rule files and listen addresses."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alfwrapper.errors import EX_DATAERR, EX_NOINPUT, EX_USAGE, AlfError
from alfwrapper.policy.prefix_list import parse_rule_lines, read_rule_file
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import ListenSpec, parse_listen

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("192.0.2.0/24", Prefix(4, 0xC0000200, 24)),
        ("192.0.2.7", Prefix(4, 0xC0000207, 32)),
        ("0.0.0.0/0", Prefix(4, 0, 0)),
        (" 198.51.100.0/24 ", Prefix(4, 0xC6336400, 24)),
        ("2001:db8::/32", Prefix(6, 0x20010DB8 << 96, 32)),
        ("::/0", Prefix(6, 0, 0)),
        ("2001:db8::1", Prefix(6, (0x20010DB8 << 96) | 1, 128)),
        ("::ffff:192.0.2.0/120", Prefix(4, 0xC0000200, 24)),  # IPv4-mapped becomes IPv4
    ],
)
def test_parse_prefix(text: str, expected: Prefix) -> None:
    assert parse_prefix(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("300.1.2.3/8", "not an IPv4 or IPv6"),
        ("example.org", "not an IPv4 or IPv6"),
        ("192.0.2.0/33", "longer than 32"),
        ("2001:db8::/129", "longer than 128"),
        ("192.0.2.0/-1", "bad prefix length"),
        ("192.0.2.0/", "bad prefix length"),
        ("192.0.2.0/٣", "bad prefix length"),
        ("192.0.2.5/24", "did you mean 192.0.2.0/24"),
        ("2001:db8::1/32", "did you mean 2001:db8::/32"),
        ("fe80::1%eth0", "not an IPv4 or IPv6"),
        ("fe80::%1/64", "not an IPv4 or IPv6"),  # ipaddress alone would take the scope id
        ("192.0.2.0/255.255.255.0", "bad prefix length"),  # ... and a netmask
        ("192.0.2.0/0.0.0.255", "bad prefix length"),  # ... and a host mask
        ("192.0.2.010", "not an IPv4 or IPv6"),  # octal or decimal? refused
    ],
)
def test_parse_prefix_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prefix(text)


def test_prefix_str_round_trips() -> None:
    for text in ("192.0.2.0/24", "2001:db8::/32", "0.0.0.0/0", "2001:db8::1/128"):
        assert str(parse_prefix(text)) == text


@given(st.text(max_size=60))
def test_parse_prefix_never_crashes(text: str) -> None:
    try:
        prefix = parse_prefix(text)
    except ValueError:
        return
    assert prefix.family in (4, 6)
    assert 0 <= prefix.length <= (32 if prefix.family == 4 else 128)


@given(st.ip_addresses(), st.integers(0, 128))
def test_parsed_prefixes_have_no_host_bits(address: object, length: int) -> None:
    text = f"{address}/{length}"
    try:
        prefix = parse_prefix(text)
    except ValueError:
        return
    width = 32 if prefix.family == 4 else 128
    assert prefix.value & ((1 << (width - prefix.length)) - 1) == 0


def test_rule_lines_comments_and_blanks() -> None:
    lines = ["# header", "", "192.0.2.0/24  # office", "   ", "2001:db8::/32"]
    assert parse_rule_lines(lines, "f") == [
        parse_prefix("192.0.2.0/24"),
        parse_prefix("2001:db8::/32"),
    ]


def test_rule_lines_error_names_file_and_line() -> None:
    with pytest.raises(AlfError) as info:
        parse_rule_lines(["192.0.2.0/24", "# ok", "192.0.2.300"], "rules.txt")
    assert info.value.what == "rules.txt:3"
    assert info.value.exit_code == EX_DATAERR


def test_missing_rule_file(tmp_path: Path) -> None:
    with pytest.raises(AlfError) as info:
        read_rule_file(str(tmp_path / "nope"))
    assert info.value.exit_code == EX_NOINPUT
    assert "no such file" in info.value.line()


def test_binary_rule_file(tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(AlfError, match="UTF-8"):
        read_rule_file(str(path))


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        ("stream", "8080", ListenSpec("stream", "::", 8080)),
        ("stream", ":8080", ListenSpec("stream", "::", 8080)),
        ("stream", "[::]:8080", ListenSpec("stream", "::", 8080)),
        ("stream", "0.0.0.0:80", ListenSpec("stream", "0.0.0.0", 80)),
        ("datagram", "[2001:db8::1]:53", ListenSpec("datagram", "2001:db8::1", 53)),
        ("datagram", "192.0.2.1:65535", ListenSpec("datagram", "192.0.2.1", 65535)),
    ],
)
def test_parse_listen(kind: str, text: str, expected: ListenSpec) -> None:
    assert parse_listen(kind, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "65536",
        "[::]",
        "[::]8080",
        "2001:db8::1:80",
        "localhost:80",
        "1.2.3:80",
        "[::]:http",
        "192.0.2.1:",
    ],
)
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(AlfError) as info:
        parse_listen("stream", text)
    assert info.value.exit_code == EX_USAGE
    assert info.value.what == "--listen"


def test_a_fingerprint_is_found_again_however_the_files_were_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`explain SERVICE` builds the rules again and compares fingerprints: a start's
    (cheap: settled rule files by identity, else by contents) is found again by a later
    process either way while nothing changed, and by neither once a file did."""
    import os  # noqa: PLC0415
    import time  # noqa: PLC0415

    from alfwrapper.cli.wrapper import parse_policy  # noqa: PLC0415
    from alfwrapper.host import cachedir  # noqa: PLC0415

    monkeypatch.setenv("ALFWRAPPER_CACHE", str(tmp_path / "cache"))
    rules = tmp_path / "deny.txt"
    rules.write_text("".join(f"198.51.100.{i}\n" for i in range(40)))
    argv = ["--deny-file", str(rules), "--allow", "203.0.113.0/24", "--deny-set", "s"]

    def both() -> tuple[str, str]:
        built = parse_policy(argv).rules_for("web")
        return built.fingerprint(), built.fingerprint(cheap=False)

    fresh = both()  # written just now: by contents only
    assert fresh[0] == fresh[1]
    time.sleep(cachedir.RACY_NS / 1e9 + 0.1)
    settled = both()  # settled: by identity, or by contents as before
    assert settled[0] != fresh[0] and settled[1] == fresh[0]
    assert both() == settled  # a later process, the same files
    os.utime(rules)  # touched: the identity changed, the contents did not
    assert both()[0] != settled[0] and both()[1] == fresh[1]
    rules.write_text("198.51.100.0/24\n")
    assert fresh[0] not in both()
