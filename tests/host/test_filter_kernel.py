"""The loaded program, run by the kernel (BPF_PROG_TEST_RUN), agrees with the rules."""

from __future__ import annotations

import ctypes
import random
import time
from typing import Any

import pytest
from helpers.oracle import passes, probe_addresses, random_rules

from alfwrapper.bpf import compiler
from alfwrapper.host.bpf_calls import prog_test_run
from alfwrapper.host.frames import tcp_syn_frame, udp_frame
from alfwrapper.policy import knocking
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import KnockRules, SocketRules, SubnetRules

pytestmark = pytest.mark.host


def verdicts(rules: SubnetRules, addresses: list[tuple[int, int]]) -> list[bool]:
    loaded = compiler.load_rules(SocketRules(subnets=rules))
    return [
        prog_test_run(loaded.fd, udp_frame(family, value)).retval != 0
        for family, value in addresses
    ]


@pytest.mark.parametrize("seed", range(6))
def test_kernel_agrees_with_rules(bpf_root: None, seed: int) -> None:
    rng = random.Random(seed)
    rules = random_rules(rng, rng.choice((3, 30, 300)))
    addresses = probe_addresses(rng, rules, 500)
    got = verdicts(rules, addresses)
    wrong = [
        (f, hex(v)) for (f, v), g in zip(addresses, got, strict=True) if g != passes(rules, f, v)
    ]
    assert not wrong, f"{len(wrong)} wrong verdicts, e.g. {wrong[:5]}"
    # The model's own verdict, which judges the peer of an Accept=yes connection
    # (backlog.rules_judge), is the kernel's too.
    model = [rules.passes(f, v) for f, v in addresses]
    differ = [(f, hex(v)) for (f, v), g, m in zip(addresses, got, model, strict=True) if g != m]
    assert not differ, f"{len(differ)} model verdicts differ, e.g. {differ[:5]}"


@pytest.mark.parametrize("root_bits", [16, 19, 24])
def test_kernel_agrees_at_every_ipv4_table_size(
    bpf_root: None, root_bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The IPv4 table's first level is sized per rule set (16 to 24 bits): the kernel
    reads each size as written, leaves included (/32s and /25s split blocks at each)."""
    from alfwrapper.bpf import subnet_table  # noqa: PLC0415

    monkeypatch.setattr(subnet_table, "V4_ROOT_BITS", range(root_bits, root_bits + 1))
    rng = random.Random(root_bits)
    # Long prefixes all over two lines' worth of blocks (64 blocks a line), so that
    # lines hold many split blocks, and a few elsewhere.
    region = 1 << (32 - root_bits + 7)
    base = 0xC0000000
    allow, deny = [parse_prefix(f"192.0.0.0/{32 - (32 - root_bits + 7)}")], []
    for _ in range(150):
        length = rng.randint(root_bits + 1, 32)
        value = (base + rng.randrange(region)) >> (32 - length) << (32 - length)
        (allow if rng.random() < 0.3 else deny).append(Prefix(4, value, length))
    allow += [parse_prefix(p) for p in ("198.51.100.77", "203.0.113.128/25", "10.0.0.0/8")]
    deny += [parse_prefix(p) for p in ("203.0.113.130/31", "10.1.0.0/16")]
    rules = SubnetRules(allow=tuple(allow), deny=tuple(deny))
    table = subnet_table.build_subnet_table(rules)
    assert table.v4.root_bits == root_bits
    crowded = [bin(w).count("1") for w in table.v4.lines[:, 0].tolist()]
    assert max(crowded) >= 20, crowded  # leaves found by rank within a line
    addresses = [(f, v) for f, v in probe_addresses(rng, rules, 800) if f == 4]
    got = verdicts(rules, addresses)
    wrong = [hex(v) for (f, v), g in zip(addresses, got, strict=True) if g != passes(rules, f, v)]
    assert not wrong, f"{len(wrong)} wrong verdicts, e.g. {wrong[:5]}"


def test_kernel_agrees_on_ipv6_bucket_levels(
    bpf_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IPv6 levels of up to 8 bytes sit in one-cache-line buckets, probed each on its
    own, the deepest entry deciding; keys past a full bucket go to their second one.
    Three levels here (/40, /48, /64, with allow and deny crossing), and enough /64s
    that some buckets fill."""
    from alfwrapper.bpf import subnet_table  # noqa: PLC0415

    monkeypatch.setattr(subnet_table, "KEYS_PER_BUCKET", 5)  # crowded: second buckets used
    rng = random.Random(6)
    base = 0x20010DB8 << 96
    allow = [Prefix(6, base | (i << 88), 40) for i in range(4)]
    deny = [Prefix(6, base | (rng.getrandbits(26) << 64), 64) for _ in range(3000)]
    allow += [Prefix(6, base | (rng.getrandbits(10) << 80), 48) for _ in range(40)]
    rules = SubnetRules(allow=tuple(allow), deny=tuple(deny))
    table = subnet_table.build_subnet_table(rules)
    assert [b.nbytes for b in table.bucket_levels] == [5, 6, 8] and table.levels == ()
    seconds = [
        p
        for p in deny
        if subnet_table.lookup_buckets(table, p.value, -1) != -1
        and not _first_bucket_holds(table, p.value >> 64)
    ]
    assert seconds, "no key went to its second bucket: the test would not cover it"
    addresses = [(f, v) for f, v in probe_addresses(rng, rules, 1500) if f == 6]
    addresses += [(6, p.value | 1) for p in seconds]
    got = verdicts(rules, addresses)
    wrong = [hex(v) for (f, v), g in zip(addresses, got, strict=True) if g != passes(rules, f, v)]
    assert not wrong, f"{len(wrong)} wrong verdicts, e.g. {wrong[:5]}"


def _first_bucket_holds(table: Any, key: int) -> bool:
    level = table.bucket_levels[-1]
    index = level.offset + ((key * level.multipliers[0]) % 2**64 >> (64 - level.bits))
    return key in [int(w) for w in table.buckets[index][:7]]


def test_pass_keeps_the_whole_packet(bpf_root: None) -> None:
    # A socket filter's return value is a length; anything short of "all" would trim TCP.
    loaded = compiler.load_rules(
        SocketRules(subnets=SubnetRules(deny=(parse_prefix("198.51.100.0/24"),)))
    )
    assert prog_test_run(loaded.fd, udp_frame(4, 0xC0000201)).retval == 0xFFFFFFFF


def test_non_ip_is_dropped(bpf_root: None) -> None:
    loaded = compiler.load_rules(
        SocketRules(subnets=SubnetRules(deny=(parse_prefix("198.51.100.0/24"),)))
    )
    arp = bytes(6) + bytes(6) + b"\x08\x06" + bytes(28)
    assert prog_test_run(loaded.fd, arp).retval == 0
    assert prog_test_run(loaded.fd, udp_frame(6, parse_prefix("2001:db8::1").value)).retval != 0


def _shift_clock(loaded: compiler.LoadedFilter, seconds: int) -> None:
    """Move the filter's idea of UTC by seconds (its TAI-to-UTC offset), as if time passed."""
    config = loaded.tables[b"knock_config"]
    leaf = config[config.Key(0)]
    leaf.tai_to_utc_ns += seconds * 1_000_000_000
    config[config.Key(0)] = leaf


def _knock_opens(loaded: compiler.LoadedFilter, source: int, ports: tuple[int, ...]) -> bool:
    def run(sport: int) -> bool:
        frame = tcp_syn_frame(4, source, sport, 0xC0000201, 8080)
        return prog_test_run(loaded.fd, frame).retval != 0

    assert not any(run(port) for port in ports)  # knocks are dropped
    return run(50000)


def test_secret_knock_follows_the_clock_across_the_horizon(bpf_root: None) -> None:
    """The sequence of the window the kernel's clock is in opens; an old window's does
    not; this holds at the start, the middle and the end of the 7-day horizon, and not
    beyond it.  The client's sequences come from the client's clock arithmetic
    (`alfwrapper knock`), the filter's from its map rows and the kernel's TAI clock."""
    window = 30
    rules = KnockRules(secret=b"k" * 32, window=window, steps=3)
    loaded = compiler.load_rules(SocketRules(knock=rules))
    rows = knocking.HORIZON_SECONDS // window
    shifted = 0
    source = 0xC6336400  # 198.51.100.0, a new source for each probe
    for ahead in (0, 1, 7, rows // 2, rows - 2, rows + 3):
        _shift_clock(loaded, (ahead - shifted) * window)
        shifted = ahead
        now = time.time() + ahead * window
        current = knocking.secret_ports(rules.secret, knocking.utc_window(window, now), 3)
        stale = knocking.secret_ports(rules.secret, knocking.utc_window(window, now) - 5, 3)
        source += 2
        assert not _knock_opens(loaded, source, stale), f"{ahead} windows ahead: stale opened"
        opened = _knock_opens(loaded, source + 1, current)
        assert opened == (ahead < rows), f"{ahead} windows ahead (horizon {rows}): {opened}"


def test_subnet_key_layout_is_handed_to_c_as_defined(bpf_root: None) -> None:
    """struct subnet_key is defined once in Python (subnet_table.KEY_FIELDS) and handed to
    C as generated code: the map BCC built from it has exactly that layout, and keys packed
    by Python read back field by field."""
    from alfwrapper.bpf.parts import SUBNET_KEY  # noqa: PLC0415
    from alfwrapper.bpf.subnet_table import build_subnet_table, encode_nodes  # noqa: PLC0415

    # Levels deeper than 8 bytes are in the hash map (shallower ones in buckets).
    rules = SubnetRules(
        allow=(parse_prefix("2001:db8:1:2:ff00::/72"), parse_prefix("2001:db8:1:2:3:4::/96"))
    )
    loaded = compiler.load_rules(SocketRules(subnets=rules))
    key_type = loaded.tables[b"subnet_nodes"].Key
    assert ctypes.sizeof(key_type) == SUBNET_KEY.size
    table = build_subnet_table(rules)
    keys, _ = encode_nodes(table, SUBNET_KEY)
    decoded = {
        (k.nbytes, k.family, bytes(k.addr))
        for k in (
            key_type.from_buffer_copy(keys, i * SUBNET_KEY.size) for i in range(len(table.nodes))
        )
    }
    assert (9, 6, bytes.fromhex("20010db8000100 02ff") + bytes(7)) in decoded
    assert (12, 6, bytes.fromhex("20010db80001000200030004") + bytes(4)) in decoded


RING_WRITER = """
struct record { u32 seq; u8 body[32]; };  /* 36 bytes: 48 in the ring, which 4096 does not divide */
BPF_RINGBUF_OUTPUT(events, 1);
BPF_ARRAY(next, u32, 1);
int write(struct __sk_buff *skb) {
    u32 zero = 0;
    u32 *seq = next.lookup(&zero);
    if (!seq)
        return 0;
    struct record r = {};
    r.seq = *seq;
    r.body[31] = (u8)*seq;
    *seq += 1;
    events.ringbuf_output(&r, sizeof(r), 0);
    return 0;
}
"""


def test_ring_buffer_read_by_mmap_across_the_wrap(bpf_root: None) -> None:
    """The reader that needs no bpf(2) call (kernels before 6.5, for users) reads every
    record once, in order, also those that wrap around the end of the ring."""
    import bcc  # noqa: PLC0415

    from alfwrapper.host import kernel_headers, ringbuf  # noqa: PLC0415

    with kernel_headers.for_bcc(kernel_headers.find()) as include:
        bpf = bcc.BPF(text=RING_WRITER.encode(), cflags=include)
    try:
        prog = bpf.load_func(b"write", bcc.BPF.SOCKET_FILTER)
        got: list[bytes] = []
        rings = ringbuf._MappedRings([bpf[b"events"].map_fd], lambda _, raw: got.append(raw))
        try:
            frame = udp_frame(4, 0xC0000202)
            for _ in range(7):  # 7 x 80 records of 48 bytes: round the 4096-byte ring 6 times
                prog_test_run(prog.fd, frame, repeat=80)
                assert rings.consume() == 80
            assert rings.consume() == 0
        finally:
            rings.close()
    finally:
        bpf.cleanup()
    assert [int.from_bytes(r[:4], "little") for r in got] == list(range(560))
    assert all(len(r) == 36 and r[35] == i % 256 for i, r in enumerate(got))
