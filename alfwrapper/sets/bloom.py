"""The sieve: a blocked Bloom filter of a set's whole addresses, a 64-bit word each,
which sets.c reads before the hash, so that a source in none of them costs a packet
one cache line: which bits an address sets, and the sieve's words written.
Its other half, the layout programs are built from (the word, flags and hash
constants SIEVE_*, sieve_shift, the header's sieve_header and sieve_fits, put_shift
and sieve_map), stays in bpf/parts.py: the program's -D settings and Sets.bind need
it there, and bpf may not import sets.  The sieve's pin keeps its role's name,
"sieve" (SET_ROLES), which is persisted state.
"""

from __future__ import annotations

import mmap
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from alfwrapper.bpf.parts import (
    SIEVE_BIT1,
    SIEVE_BIT2,
    SIEVE_MIX,
    SIEVE_MULTIPLIER,
    SIEVE_RANGE_BITS,
    SIEVE_WORD,
    sieve_shift,
)
from alfwrapper.host import bpf_calls
from alfwrapper.policy.prefix_list import Array
from alfwrapper.policy.prefixes import FAMILY_BITS, Prefix

BATCH = 65536  # entries in one batch update (the sieve's words; the hosts', content.py)
INDEX = struct.Struct("=I")  # an array's key (the sieve's; hosts_at's, tree.py)
SIEVE_BITS_AN_ENTRY = 32  # the sieve's size: about 0.5% of sources sent on to the hash
M64 = (1 << 64) - 1
Spots = dict[int, int]  # a word's index -> the bits its entries set
_RANGES = {family: 1 << bit for family, bit in SIEVE_RANGE_BITS.items()}
_CHUNK = 8192  # words compared at once when a sieve is rebuilt


def sieve_words(size: int) -> int:
    """How many words (besides its header) the sieve of a set of ``size`` has: a
    power of two, SIEVE_BITS_AN_ENTRY bits for each entry it may hold, 64 at least."""
    bits = max(size, 1) * SIEVE_BITS_AN_ENTRY
    return 1 << max(6, (bits // 64 - 1).bit_length())


class Sieved(NamedTuple):
    """What some prefixes set in a sieve: their whole addresses' bits by word, and
    the bits every word holds for the families of their ranges."""

    spots: Spots
    ranges: int


def sieved(shift: int, prefixes: Iterable[Prefix]) -> Sieved:
    """Where ``prefixes`` set their bits in a sieve of this shift, as sets.c's
    set_sieve finds them."""
    found: Spots = {}
    ranges = 0
    for p in prefixes:
        if p.length != FAMILY_BITS[p.family]:
            ranges |= _RANGES[p.family]
            continue
        key = p.value if p.family == 4 else (p.value >> 64) ^ (p.value & M64) * SIEVE_MIX
        index, bits = _spot(key, shift)
        found[index] = found.get(index, 0) | bits
    return Sieved(found, ranges)


def _spot(key: int, shift: int) -> tuple[int, int]:
    """The word and bits of an address's key (sets.c's set_sieve; spots_of has it for
    many keys at once, held to it by tests/unit/test_set_keys.py)."""
    h = (key * SIEVE_MULTIPLIER) & M64
    bits = 1 << (h >> SIEVE_BIT1 & 0x3FFF) % 62 | 1 << (h >> SIEVE_BIT2 & 0x7FFF) % 62
    return 1 + (h >> shift), bits


def words_of(sieve: int) -> int:
    return bpf_calls.map_shape(sieve)[3] - 1


def shift_of(sieve: int) -> int:
    return sieve_shift(1 + words_of(sieve))


def _write_words(sieve: int, indexes: Sequence[int], values: Sequence[int]) -> None:
    """Write words in batches, word 1 and then the header last: sieve_add reads a
    family's range bit in word 1 as every word's, and a start takes a header naming
    the set's hosts map as a sieve built for them, so neither may be there before the
    words it speaks for."""
    for last in (1, 0):
        if last in indexes:
            at = indexes.index(last)
            indexes = [*indexes[:at], *indexes[at + 1 :], last]
            values = [*values[:at], *values[at + 1 :], values[at]]
    for start in range(0, len(indexes), BATCH):
        part = slice(start, start + BATCH)
        count = len(indexes[part])
        keys, words = array("I", indexes[part]).tobytes(), array("Q", values[part]).tobytes()
        bpf_calls.map_update_batch(sieve, keys, words, count)


@contextmanager
def _mapped(sieve: int, words: int) -> Iterator[memoryview]:
    """The sieve's words, its header first, through a read-only mapping."""
    length = (1 + words) * SIEVE_WORD.size
    with (
        mmap.mmap(sieve, length, mmap.MAP_SHARED, mmap.PROT_READ) as region,
        memoryview(region) as view,
        view.cast("Q") as cast,
    ):
        yield cast


def sieve_add(sieve: int, bits: Sieved) -> None:
    """Set these bits (and, in every word, the ranges' families), before the entries
    that need them go in."""
    words = words_of(sieve)
    found = bits.spots
    with _mapped(sieve, words) as word:
        if bits.ranges & ~word[1]:  # a family new to the trie: every word says so first
            found = {i: found.get(i, 0) | bits.ranges for i in range(1, words + 1)}
        indexes, values = (_grown if len(found) <= _FEW_WORDS else _grown_many)(word, found)
    _write_words(sieve, indexes, values)


_FEW_WORDS = 256  # words sieve_add looks at one by one; more, in numpy's columns


def _grown(word: memoryview, found: Spots) -> tuple[list[int], list[int]]:
    """The words that ``found``'s bits change, and what they become."""
    indexes, values = [], []
    for index, want in found.items():
        old = word[index]
        if old | want != old:
            indexes.append(index)
            values.append(old | want)
    return indexes, values


def _grown_many(word: memoryview, found: Spots) -> tuple[list[int], list[int]]:
    """_grown, for many words at once (a bouncer's answer: a Python loop took half
    as long as the kernel's writes)."""
    import numpy as np  # noqa: PLC0415

    index = np.fromiter(found.keys(), dtype=np.int64, count=len(found))
    old = np.frombuffer(word, dtype=np.uint64)[index]
    grown = old | np.fromiter(found.values(), dtype=np.uint64, count=len(found))
    changed = grown != old
    return index[changed].tolist(), grown[changed].tolist()


def sieve_exact(sieve: int, bits: Sieved, hosts_at: int) -> None:
    """Make the sieve hold these bits alone, built for the set of ``hosts_at`` (its
    fd) with nothing stale: called once the set holds no entry that needs any other.
    Only the runs of words that differ are written."""
    words = words_of(sieve)
    image = array("Q", [bits.ranges]) * (1 + words)
    image[0] = bpf_calls.map_info_id(hosts_at)  # the header (sieve_header): nothing stale
    for index, want in bits.spots.items():
        image[index] = want | bits.ranges
    indexes: list[int] = []
    with _mapped(sieve, words) as word:
        for first in range(0, 1 + words, _CHUNK):
            span = slice(first, min(first + _CHUNK, 1 + words))
            if word[span] != memoryview(image)[span]:
                indexes.extend(range(span.start, span.stop))
    _write_words(sieve, indexes, [image[i] for i in indexes])


def spots_of(key: Array, shift: int) -> Spots:
    """_spot of many sieve keys at once: the hash wraps at 64 bits, as the kernel's does."""
    import numpy as np  # noqa: PLC0415

    h = key * np.uint64(SIEVE_MULTIPLIER)
    one = (h >> np.uint64(SIEVE_BIT1) & np.uint64(0x3FFF)) % np.uint64(62)
    two = (h >> np.uint64(SIEVE_BIT2) & np.uint64(0x7FFF)) % np.uint64(62)
    bits = np.uint64(1) << one | np.uint64(1) << two
    index = (h >> np.uint64(shift)) + np.uint64(1)
    order = np.argsort(index, kind="stable")
    index, bits = index[order], bits[order]
    starts = np.flatnonzero(np.concatenate(([True], index[1:] != index[:-1])))
    words = np.bitwise_or.reduceat(bits, starts)
    return dict(zip(index[starts].tolist(), words.tolist(), strict=True))


def set_header(sieve: int, hosts: int, stale: int) -> None:
    """The sieve's word 0 (sieve_header): the id of its hosts map, and removals."""
    bpf_calls.map_update(sieve, INDEX.pack(0), SIEVE_WORD.pack(hosts | stale << 32))
