"""Single-packet authorization, judged by the kernel (BPF_PROG_TEST_RUN) in the SPA
socket's real program (spa.c, KNOCK_SPA 2): the test vectors of
alfwrapper.policy(5) against the kernel, policy/spa.py and the example client; and
every datagram that must open nothing (replayed, stale, forged, cut, padded, a bit
flipped anywhere) opening nothing, counted under its verdict."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.support import ROOT

from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import SPA_VERDICTS, FillEnv
from alfwrapper.errors import AlfError
from alfwrapper.host.bpf_calls import prog_test_run
from alfwrapper.host.frames import udp_frame
from alfwrapper.policy import spa
from alfwrapper.policy.rules import KnockRules, SocketRules

sys.path.insert(0, str(ROOT / "examples"))
import spa_knock

pytestmark = pytest.mark.host

SECRET = b"alfwrapper test secret 0123456789"
PORT = 8080
WINDOW = 30
SENDER = 0xC6336409  # 198.51.100.9, where the frames come from
ID = spa.key_id(SECRET)


def man_vectors() -> dict[str, Any]:
    """The test vectors as alfwrapper.policy(5) writes them (what a client author reads)."""
    text = (ROOT / "man/alfwrapper.policy.5").read_text()
    section = text.split(".Sh SPA DATAGRAMS", 1)[1].split(".Sh ", 1)[0]
    blocks = re.findall(r"\.Bd -literal -offset indent\n([0-9a-f\n]+)\.Ed", section)
    datagrams = [bytes.fromhex(b.replace("\n", "")) for b in blocks]
    return {
        "siphash": re.search(r"2f:\n\.Li ([0-9a-f]{16}) \.", section).group(1),  # type: ignore[union-attr]
        "key": re.search(r"gives the key\n\.Li ([0-9a-f]{32})\n", section).group(1),  # type: ignore[union-attr]
        "id": int(re.search(r"and the id\n\.Li ([0-9a-f]{8}) ;", section).group(1), 16),  # type: ignore[union-attr]
        "secret": re.search(r"The secret\n\.Li (.+)\n", section).group(1).encode(),  # type: ignore[union-attr]
        "datagrams": dict(zip(("203.0.113.7", "2001:db8::7", None), datagrams[:3], strict=True)),
        "version 1": datagrams[3],
        "sent": 1800000000123456789,
        "nonce": bytes(range(12)),
    }


def test_the_documented_vectors_are_what_both_clients_make() -> None:
    v = man_vectors()
    assert v["secret"] == SECRET
    assert spa.siphash24(bytes(range(16)), bytes(range(48))).hex() == v["siphash"]
    assert spa_knock.siphash24(bytes(range(16)), bytes(range(48))).hex() == v["siphash"]
    assert spa.key_of(SECRET).hex() == v["key"] and spa.key_id(SECRET) == v["id"]
    keys = spa.keys(SECRET, ())
    for address, raw in v["datagrams"].items():
        fields = spa.Datagram(PORT, v["sent"], v["nonce"], address, v["id"])
        ours = fields.sealed(spa.key_of(SECRET))
        theirs = spa_knock.datagram(SECRET, PORT, address or "sender", v["sent"], v["nonce"])
        assert ours == theirs == raw, address
        assert spa.read(raw, keys) == fields
    # Version 1 (earlier clients'): under the shared secret alone.
    old = spa.Datagram(PORT, v["sent"], bytes(range(16)), "203.0.113.7", version=spa.SHARED)
    assert old.sealed(spa.key_of(SECRET)) == v["version 1"]
    assert spa.read(v["version 1"], keys, spa.key_id(SECRET)) == old
    assert spa.read(v["version 1"], keys) is None


class Verifier:
    """The SPA socket's program, loaded and filled as a start fills it (no pins)."""

    def __init__(
        self, sender: bool = False, keys: tuple[bytes, ...] = (), shared: bytes = SECRET
    ) -> None:
        knock = KnockRules(
            secret=shared, spa_keys=keys, spa=True, verifier=True, window=WINDOW, spa_sender=sender
        )
        self.loaded = compiler.load_program(
            program.plan_program(SocketRules(knock=knock)), FillEnv()
        )
        self.tables = self.loaded.tables
        self.began = self.since(0)  # as explain does: no table lost before this one

    def since(self, utc_ns: int) -> int:
        """Set knock_spa_since (datagrams sent before are stale); returns what it was."""
        table = self.tables[b"knock_spa_since"]
        was = int(table[table.Key(0)].value)
        table[table.Key(0)] = table.Leaf(utc_ns)
        return was

    def widest(self, seconds: int | None = None) -> int:
        """The widest window of the programs sharing the table (knock_spa_since[1]): set
        to ``seconds`` if given, as a wider program's start sets it; returns what it was."""
        table = self.tables[b"knock_spa_since"]
        was = int(table[table.Key(1)].value)
        if seconds is not None:
            table[table.Key(1)] = table.Leaf(seconds)
        return was

    def clock(self, utc_ns: int) -> None:
        """Make the kernel's UTC (its TAI clock plus the offset) read ``utc_ns`` now."""
        config = self.tables[b"knock_config"]
        leaf = config[config.Key(0)]
        leaf.tai_to_utc_ns = utc_ns - time.clock_gettime_ns(time.CLOCK_TAI)
        config[config.Key(0)] = leaf

    def send(self, raw: bytes, source: int = SENDER, family: int = 4, port: int = PORT) -> int:
        return prog_test_run(self.loaded.fd, udp_frame(family, source, raw, dport=port)).retval

    def counts(self) -> dict[str, int]:
        table = self.tables[b"knock_spa_counts"]
        return {v: sum(table.per_cpu(table.Key(i))) for i, v in enumerate(SPA_VERDICTS)}

    def opened(self) -> set[str]:
        """The addresses knock_state holds open now."""
        table = self.tables[b"knock_state"]
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        found = set()
        for key in table.keys():
            raw = bytes(key)
            family, address = raw[0], raw[4:20]
            if table[key].open_until_ns > now:
                packed = address[:4] if family == 4 else address
                found.add(str(ipaddress.ip_address(packed)))
        return found


@pytest.fixture
def verifier(bpf_root: None) -> Iterator[Verifier]:
    yield Verifier()


def test_the_kernel_takes_the_documented_vectors_once(verifier: Verifier) -> None:
    v = man_vectors()
    verifier.clock(v["sent"])
    for address in ("203.0.113.7", "2001:db8::7"):
        assert verifier.send(v["datagrams"][address]) == 0  # nothing is ever delivered
    assert verifier.opened() == {"203.0.113.7", "2001:db8::7"}
    assert verifier.counts()["accepted"] == 2
    # The third names no address: only a policy with knock-spa-sender takes it.
    assert verifier.send(v["datagrams"][None]) == 0
    assert verifier.counts()["malformed"] == 1 and len(verifier.opened()) == 2
    lenient = Verifier(sender=True)
    lenient.clock(v["sent"])
    lenient.send(v["datagrams"][None], source=0xCB00710B)  # from 203.0.113.11
    assert lenient.opened() == {"203.0.113.11"} and lenient.counts()["accepted"] == 1
    # Again, from the same sender and from another: replays, opening nothing more.
    verifier.send(v["datagrams"]["203.0.113.7"])
    verifier.send(v["datagrams"]["2001:db8::7"], source=0xCB00710B)
    assert verifier.counts()["replayed"] == 2 and len(verifier.opened()) == 2
    # Version 1, under the shared secret: taken; by a socket of clients' keys alone, not.
    verifier.send(v["version 1"])
    assert verifier.counts()["accepted"] == 3
    keyed = Verifier(keys=(SECRET,), shared=b"")
    keyed.clock(v["sent"])
    keyed.send(v["version 1"])
    keyed.send(v["datagrams"]["203.0.113.7"])
    assert keyed.counts()["malformed"] == 1 and keyed.counts()["accepted"] == 1


def _sealed(body: bytes, key: bytes = spa.key_of(SECRET)) -> bytes:
    return body + spa.siphash24(key, body)


def test_nothing_unsound_opens_and_each_is_counted(verifier: Verifier) -> None:
    now = time.time_ns()
    verifier.clock(now)
    good = spa.datagram(SECRET, PORT, "192.0.2.7", now)
    body = good[:48]
    expect = dict.fromkeys(SPA_VERDICTS, 0)
    cases = {
        "malformed": [
            good[:55],
            good + b"\0",
            b"",
            good[:48],  # cut, padded, empty, no tag
            spa.datagram(SECRET, PORT + 1, "192.0.2.7", now),  # for another SPA port
            _sealed(body[:36] + b"\1" + body[37:]),  # an IPv4 address with more after it
            _sealed(body[:5] + b"\7" + body[6:]),  # family 7
            spa.Datagram(PORT, now, os.urandom(12), None, ID).sealed(spa.key_of(SECRET)),
            _sealed(
                spa.Datagram(PORT, now, os.urandom(12), "2001:db8::1", ID).body()[:32]
                + bytes(10)
                + b"\xff\xff"
                + bytes([192, 0, 2, 7])
            ),  # ::ffff:192.0.2.7
        ],
        "bad_mac": [
            spa.datagram(b"another secret, just as long as it", PORT, "192.0.2.7", now),
            body + bytes(8),
            # The shared key's tag under another key's id (the socket's keys alone).
            _sealed(
                body[:16]
                + spa.key_id(b"another secret, just as long as it").to_bytes(4, "big")
                + body[20:]
            ),
        ],
        "stale": [
            spa.datagram(SECRET, PORT, "192.0.2.7", now - (WINDOW + 2) * 10**9),
            spa.datagram(SECRET, PORT, "192.0.2.7", now + (WINDOW + 2) * 10**9),
            spa.datagram(SECRET, PORT, "192.0.2.7", 0),
            spa.datagram(SECRET, PORT, "192.0.2.7", (1 << 64) - 1),
        ],
    }
    for verdict, datagrams in cases.items():
        for raw in datagrams:
            verifier.send(raw)
            expect[verdict] += 1
    # A bit flipped anywhere: in the magic or version, malformed; anywhere else, the tag
    # does not fit (in the key id, it names a key the socket has not).
    for bit in range(len(good) * 8):
        flipped = bytearray(good)
        flipped[bit // 8] ^= 1 << bit % 8
        verifier.send(bytes(flipped))
        expect["malformed" if bit < 40 else "bad_mac"] += 1
    assert verifier.counts() == expect
    assert verifier.opened() == set()
    # Sound, it opens (once), over IPv6 as over IPv4.
    verifier.send(good, family=6, source=(0x20010DB8 << 96) | 9)
    expect["accepted"] += 1
    assert verifier.counts() == expect and verifier.opened() == {"192.0.2.7"}


def _same_slot(now: int, tag: bytes, address: str) -> bytes:
    """A sound datagram whose tag shares knock_spa_seen's slot with ``tag``'s."""
    key = spa.key_of(SECRET)
    slot = int.from_bytes(tag, "little") & 0xFFFF
    for _ in range(2_000_000):
        raw = spa.Datagram(PORT, now, os.urandom(12), address, ID).sealed(key)
        if int.from_bytes(raw[48:], "little") & 0xFFFF == slot:
            return raw
    raise AssertionError("no datagram of the same slot in 2,000,000 tries")


def test_a_slot_is_taken_only_from_a_datagram_the_window_refuses(verifier: Verifier) -> None:
    """Two sound datagrams whose tags share a slot: while the first could still be
    replayed, the second is refused (busy), not let in at the price of forgetting the
    first; once the window is past the first, the slot is taken, and the first,
    replayed, is stale."""
    now = time.time_ns()
    verifier.clock(now)
    first = spa.datagram(SECRET, PORT, "192.0.2.7", now)
    second = _same_slot(now, first[48:], "192.0.2.8")
    verifier.send(first)
    verifier.send(second)
    assert verifier.counts()["busy"] == 1 and verifier.opened() == {"192.0.2.7"}
    later = now + (WINDOW + 3) * 10**9
    verifier.clock(later)
    third = _same_slot(later, first[48:], "192.0.2.9")
    verifier.send(third)
    verifier.send(first)
    counts = verifier.counts()
    assert (counts["accepted"], counts["stale"]) == (2, 1), counts
    assert "192.0.2.9" in verifier.opened()


def test_a_slot_stays_seen_for_the_widest_window_sharing_its_table(verifier: Verifier) -> None:
    """The service's SPA sockets share one table, whatever their windows: a datagram
    seen stays seen while the widest of them would take it again, not only while the
    one that took it would.  A start sets the widest to its own window if wider."""
    assert verifier.widest() == WINDOW
    verifier.widest(600)  # another SPA socket of the service takes datagrams 600 s apart
    now = time.time_ns()
    verifier.clock(now)
    first = spa.datagram(SECRET, PORT, "192.0.2.7", now)
    verifier.send(first)
    later = now + (WINDOW + 3) * 10**9  # past this window, within the wider one
    verifier.clock(later)
    verifier.send(_same_slot(later, first[48:], "192.0.2.8"))
    assert verifier.counts()["busy"] == 1 and verifier.opened() == {"192.0.2.7"}
    past = now + 603 * 10**9
    verifier.clock(past)
    verifier.send(_same_slot(past, first[48:], "192.0.2.9"))
    counts = verifier.counts()
    assert (counts["accepted"], counts["busy"]) == (2, 1), counts


def test_a_wider_window_raises_the_table_it_joins(verifier: Verifier) -> None:
    """A program of a wider window joining a table raises its widest window, and the
    time before which it takes nothing to a wider window after the table was made
    (one lost before it may have taken datagrams that far ahead); a narrower one
    lowers neither."""
    from alfwrapper.bpf.parts import _spa_table_takes  # noqa: PLC0415

    table = verifier.tables[b"knock_spa_since"]
    made = int(table[table.Key(2)].value)
    assert verifier.began == made + WINDOW * 10**9
    for window in (600, 5):
        _spa_table_takes(table, window)
        assert (int(table[table.Key(0)].value), verifier.widest()) == (made + 600 * 10**9, 600)
        assert int(table[table.Key(2)].value) == made


def test_the_example_client_sends_what_the_kernel_takes(verifier: Verifier, tmp_path: Path) -> None:
    """examples/spa_knock.py, run as a user would, on the loopback: its datagram,
    caught and replayed into the kernel, opens what it says."""
    import socket  # noqa: PLC0415

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as catcher:
        catcher.bind(("127.0.0.1", 0))
        port = catcher.getsockname()[1]
        secret = tmp_path / "spa.secret"
        secret.write_bytes(SECRET + b"\n")
        out = subprocess.run([sys.executable, str(ROOT / "examples/spa_knock.py"), "127.0.0.1",
                              str(port), str(secret), "198.51.100.77"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        assert out.returncode == 0, out.stderr
        catcher.settimeout(5)
        raw, _ = catcher.recvfrom(100)
    verifier.clock(time.time_ns())
    verifier.send(raw, port=port)
    assert verifier.opened() == {"198.51.100.77"}
    assert struct.unpack(">H", raw[6:8])[0] == port


def test_a_datagram_sent_before_what_was_seen_began_is_refused(verifier: Verifier) -> None:
    """A new table begins a window after it is made (knock_spa_since): a table lost
    before it may have taken a datagram sent up to a window ahead of its taking, and
    no such datagram is taken again.  One sent before is stale."""
    now = time.time_ns()
    assert -60 * 10**9 <= verifier.began - WINDOW * 10**9 - now <= 0  # made a moment ago
    verifier.since(verifier.began)
    verifier.clock(now)
    # A client a window ahead, whose datagram a lost table may have taken just now.
    verifier.send(spa.datagram(SECRET, PORT, "192.0.2.7", now + WINDOW * 10**9 - 10**9))
    assert verifier.counts()["stale"] == 1 and verifier.opened() == set()
    verifier.clock(verifier.began)
    verifier.send(spa.datagram(SECRET, PORT, "192.0.2.7", verifier.began + 1))
    assert verifier.counts()["accepted"] == 1


def test_explain_gives_the_spa_sockets_verdict_on_a_datagram(
    bpf_root: None, tmp_path: Path
) -> None:
    """`explain --spa-datagram`: the SPA socket's own verdict on a datagram, from the
    kernel (a program of its own for each source), and what it would open."""
    from helpers.support import WRAPPER  # noqa: PLC0415

    secret = tmp_path / "spa.secret"
    secret.write_bytes(SECRET)
    good = spa.datagram(SECRET, PORT, "203.0.113.7")
    base = [*WRAPPER, "explain", "--listen", f"[::]:{PORT}", "--knock-secret", str(secret),
            "--knock-spa", "--json"]  # fmt: skip
    said = {}
    cases = {
        "good": good,
        "forged": good[:-1] + bytes([good[-1] ^ 1]),
        "cut": good[:40],
        "stale": spa.datagram(SECRET, PORT, "203.0.113.7", 1),
    }
    for label, raw in cases.items():
        out = subprocess.run(
            [*base, "--from", "198.51.100.9", "--spa-datagram", raw.hex()],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        said[label] = json.loads(out.stdout)
    # A client's own key, given to explain as to the service.
    own = tmp_path / "alice.key"
    own.write_bytes(ALICE)
    out = subprocess.run([*base, "--knock-spa-key", str(own), "--from", "198.51.100.9",
                          "--spa-datagram", spa.datagram(ALICE, PORT, "203.0.113.8").hex()],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spa"] == "accepted" and "opens 203.0.113.8" in out.stdout
    assert said["good"]["spa"] == "accepted" and "opens 203.0.113.7" in said["good"]["rule"]
    assert [said[k]["spa"] for k in ("forged", "cut", "stale")] == ["bad_mac", "malformed", "stale"]
    assert all(s["verdict"] == "drop" for s in said.values())


ALICE = b"alice's own SPA key, long enough 01"
BOB = b"bob's own SPA key, just as long 234"


def _quota_clock(verifier: Verifier) -> int:
    """Set the kernel's clock to the start of a quota period (the widest window) with
    a window of room, and return it: every datagram below is judged in one period."""
    period = verifier.widest() * 10**9
    start = (time.time_ns() // period + 1) * period
    verifier.clock(start)
    return start


def test_one_keys_flood_shuts_no_other_client_out(bpf_root: None) -> None:
    """Alice holds her key and sends 100,000 sound datagrams, as fast as she can, to
    fill the replay table against the others: she takes her share (SPA_QUOTA), the rest
    are busy, and Bob's ten knocks all open.  Without the share, her datagrams would
    hold four slots in five, and Bob's knocks would be busy."""
    from alfwrapper.bpf.parts import SPA_QUOTA  # noqa: PLC0415

    verifier = Verifier(keys=(ALICE, BOB))
    now = _quota_clock(verifier)
    for _ in range(100_000):
        verifier.send(spa.datagram(ALICE, PORT, "203.0.113.66", now))
    counts = verifier.counts()
    assert (counts["accepted"], counts["busy"]) == (SPA_QUOTA, 100_000 - SPA_QUOTA), counts
    for i in range(10):
        verifier.send(spa.datagram(BOB, PORT, f"192.0.2.{10 + i}", now))
    assert verifier.counts()["accepted"] == SPA_QUOTA + 10, verifier.counts()
    assert {f"192.0.2.{10 + i}" for i in range(10)} <= verifier.opened()
    # Alice's own next one waits for the next period; the shared secret has a share of
    # its own (those who share it share it).
    verifier.send(spa.datagram(ALICE, PORT, "203.0.113.67", now))
    verifier.send(spa.datagram(SECRET, PORT, "203.0.113.68", now))
    assert "203.0.113.67" not in verifier.opened() and "203.0.113.68" in verifier.opened()
    later = now + verifier.widest() * 10**9
    verifier.clock(later)
    verifier.send(spa.datagram(ALICE, PORT, "203.0.113.69", later))
    assert "203.0.113.69" in verifier.opened()


def test_a_client_key_opens_alone_and_goes_with_its_line(bpf_root: None) -> None:
    """Each client's key opens; a key the socket does not have (never given, or taken
    out and the program loaded again, as a reload does) opens nothing: bad_mac."""
    both = Verifier(keys=(ALICE, BOB), shared=b"")
    now = time.time_ns()
    both.clock(now)
    both.send(spa.datagram(ALICE, PORT, "192.0.2.7", now))
    both.send(spa.datagram(BOB, PORT, "192.0.2.8", now))
    both.send(spa.datagram(SECRET, PORT, "192.0.2.9", now))  # no shared secret here
    assert both.opened() == {"192.0.2.7", "192.0.2.8"}
    assert both.counts()["bad_mac"] == 1
    revoked = Verifier(keys=(BOB,), shared=b"")
    revoked.clock(now)
    revoked.send(spa.datagram(ALICE, PORT, "192.0.2.7", now))
    revoked.send(spa.datagram(BOB, PORT, "192.0.2.8", now))
    assert revoked.opened() == {"192.0.2.8"} and revoked.counts()["bad_mac"] == 1


def test_two_keys_of_one_id_are_refused() -> None:
    with pytest.raises(AlfError, match="two keys have the id"):
        spa.keys(SECRET, (ALICE, SECRET))
    assert set(spa.keys(SECRET, (ALICE, BOB))) == {spa.key_id(s) for s in (SECRET, ALICE, BOB)}
