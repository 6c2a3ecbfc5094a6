"""Many prefixes without an object each: numpy columns, and the rule-file reader that fills them.

A million rules as a million Python objects took seconds to parse and hundreds
of MiB at start-up.  A PrefixList keeps them in four columns (family, length
and the value's high and low 64 bits: 18 bytes a rule) and makes a ``Prefix``
only when one is asked for; the subnet table reads the columns directly.

``parse_rule_bytes`` parses the lines that are a plain IPv4 address or CIDR in
bulk with numpy, and hands every other line (IPv6, comments, spaces, anything
it is not sure of) to ``prefixes.parse_prefix`` one at a time, so that both ways
accept, refuse and number lines alike (tests/unit/test_prefix_list.py checks
that they agree).  numpy is imported where used, so that a missing numpy is
one clear line (cli).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from alfwrapper.errors import EX_DATAERR, AlfError, excerpt
from alfwrapper.policy.inputs import RULE_FILE_LIMIT, read_input
from alfwrapper.policy.prefixes import Prefix, parse_prefix

Array = Any  # numpy arrays (typed loosely: Debian's numpy 1.24 and pip's 2.x check alike)

_LOW = (1 << 64) - 1
_PACKED = struct.Struct("<II")  # packed(): the counts of IPv4 and IPv6 rules


class PrefixList(Sequence[Prefix]):
    """An immutable sequence of prefixes held in numpy columns.

    A column whose entries are all alike is stored once (a broadcast view), and the
    low half as u32 when every value fits: IPv4 rules cost 5 bytes each."""

    __slots__ = ("family", "length", "high", "low", "_key")

    def __init__(self, family: Array, length: Array, high: Array, low: Array) -> None:
        import numpy as np  # noqa: PLC0415

        family, high = _squeeze(family), _squeeze(high)
        if low.dtype != np.uint32 and _constant(high) == 0 and not (low >> np.uint64(32)).any():
            low = low.astype(np.uint32)
        self.family, self.length, self.high, self.low = family, length, high, low
        for column in (family, length, high, low):
            if column.strides != (0,):
                column.flags.writeable = False
        self._key: bytes | None = None

    @classmethod
    def of(cls, prefixes: Iterable[Prefix]) -> PrefixList:
        import numpy as np  # noqa: PLC0415

        if isinstance(prefixes, PrefixList):
            return prefixes
        items = list(prefixes)
        return cls(
            np.fromiter((p.family for p in items), np.uint8, len(items)),
            np.fromiter((p.length for p in items), np.uint8, len(items)),
            np.fromiter((p.value >> 64 for p in items), np.uint64, len(items)),
            np.fromiter((p.value & _LOW for p in items), np.uint64, len(items)),
        )

    @classmethod
    def concat(cls, parts: Iterable[Sequence[Prefix]]) -> PrefixList:
        """The parts one after the other; the only non-empty part itself, not a copy."""

        lists = [cls.of(p) for p in parts if len(p)]
        if len(lists) == 1:
            return lists[0]
        if not lists:
            return cls.of(())
        return cls(*(_joined([getattr(p, c) for p in lists]) for c in cls.__slots__[:4]))

    def __add__(self, other: Sequence[Prefix]) -> PrefixList:
        return PrefixList.concat([self, other])

    def __radd__(self, other: Sequence[Prefix]) -> PrefixList:
        return PrefixList.concat([other, self])

    def __len__(self) -> int:
        return len(self.family)

    @overload
    def __getitem__(self, index: int) -> Prefix: ...
    @overload
    def __getitem__(self, index: slice) -> PrefixList: ...
    def __getitem__(self, index: int | slice) -> Prefix | PrefixList:
        if isinstance(index, slice):
            return self.take(index)
        return Prefix(
            int(self.family[index]),
            int(self.high[index]) << 64 | int(self.low[index]),
            int(self.length[index]),
        )

    def take(self, index: Any) -> PrefixList:
        """The entries a slice or an index array picks."""
        length = self.length[index]
        family, high = (_picked(c, index, len(length)) for c in (self.family, self.high))
        return PrefixList(family, length, high, self.low[index])

    def __iter__(self) -> Iterator[Prefix]:
        columns = (self.family.tolist(), self.high.tolist(), self.low.tolist(),
                   self.length.tolist())  # fmt: skip
        for family, high, low, length in zip(*columns, strict=True):
            yield Prefix(family, high << 64 | low, length)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, Prefix):
            return False
        return bool(self.where(item).any())

    def where(self, prefix: Prefix) -> Array:
        """A mask of the entries equal to ``prefix``."""
        return (
            (self.family == prefix.family)
            & (self.length == prefix.length)
            & (self.high == prefix.value >> 64)
            & (self.low == prefix.value & _LOW)
        )

    def covering(self, family: int, value: int) -> PrefixList:
        """The prefixes that contain the address ``value`` of ``family``."""
        import numpy as np  # noqa: PLC0415

        width = 32 if family == 4 else 128
        shift = width - self.length.astype(np.int64)
        # the address's bits above each prefix's length, compared per half
        high = np.uint64(value >> 64)
        low = np.uint64(value & _LOW)
        keep_high = _mask_above(np.clip(shift - 64, 0, 64))
        keep_low = _mask_above(np.clip(shift, 0, 64))
        hit = (
            (self.family == family)
            & ((self.high & keep_high) == (high & keep_high))
            & ((self.low & keep_low) == (low & keep_low))
        )
        return self.take(np.flatnonzero(hit))

    def of_family(self, family: int) -> PrefixList:
        import numpy as np  # noqa: PLC0415

        return self.take(np.flatnonzero(self.family == family))

    def packed(self) -> bytes:
        """The list in the loader's compact form: counts, then per family the lengths
        and the values (IPv4: 5 bytes a rule; IPv6: 17), zlib-compressed."""
        import zlib  # noqa: PLC0415

        import numpy as np  # noqa: PLC0415

        v4, v6 = self.of_family(4), self.of_family(6)
        parts = [
            _PACKED.pack(len(v4), len(v6)),
            np.ascontiguousarray(v4.length, np.uint8).tobytes(),
            np.ascontiguousarray(v4.low, "<u4").tobytes(),
            np.ascontiguousarray(v6.length, np.uint8).tobytes(),
            np.ascontiguousarray(v6.high, "<u8").tobytes(),
            np.ascontiguousarray(v6.low, "<u8").tobytes(),
        ]
        return zlib.compress(b"".join(parts), 1)

    @classmethod
    def unpacked(cls, data: bytes, most: int) -> PrefixList:
        """A packed() list, checked as strictly as parse_prefix checks text (lengths
        within the family's width, no host bits, no IPv4-mapped IPv6), of at most
        ``most`` rules: ValueError otherwise.  Decompresses no more than that takes."""
        import zlib  # noqa: PLC0415

        import numpy as np  # noqa: PLC0415

        inflate = zlib.decompressobj()
        try:
            head = inflate.decompress(data, _PACKED.size)
            n4, n6 = _PACKED.unpack(head) if len(head) == _PACKED.size else (-1, -1)
            if n4 < 0 or n4 + n6 > most:
                raise ValueError(f"more than {most} rules, or no counts")
            size = n4 * 5 + n6 * 17
            body = inflate.decompress(inflate.unconsumed_tail, size) if size else b""
        except zlib.error as err:
            raise ValueError(f"not zlib data ({err})") from None
        if len(body) != size or inflate.unconsumed_tail or inflate.unused_data or not inflate.eof:
            raise ValueError("the counts and the data differ in length")
        at = 0

        def column(dtype: str, count: int) -> Array:
            nonlocal at
            width = np.dtype(dtype).itemsize * count
            out = np.frombuffer(body, dtype, count, at)
            at += width
            return out.astype(dtype.replace("<", "="))

        len4, low4 = column("u1", n4), column("<u4", n4).astype(np.uint64)
        len6, high6, low6 = column("u1", n6), column("<u8", n6), column("<u8", n6)
        if (len4 > 32).any() or (len6 > 128).any():
            raise ValueError("a prefix length beyond its family's width")
        host4 = low4 & ~_mask_above(np.uint64(32) - len4.astype(np.uint64)) & np.uint64(_LOW >> 32)
        shift = 128 - len6.astype(np.int64)
        host6 = (high6 & ~_mask_above(np.clip(shift - 64, 0, 64))) | (
            low6 & ~_mask_above(np.clip(shift, 0, 64))
        )
        if host4.any() or host6.any():
            raise ValueError("a prefix with host bits set")
        mapped = (high6 == 0) & ((low6 >> np.uint64(32)) == 0xFFFF) & (len6 >= 96)
        if mapped.any():
            raise ValueError("an IPv4-mapped IPv6 prefix (send it as IPv4)")
        family = np.concatenate([np.full(n4, 4, np.uint8), np.full(n6, 6, np.uint8)])
        return cls(
            family,
            np.concatenate([len4, len6]),
            np.concatenate([np.zeros(n4, np.uint64), high6]),
            np.concatenate([low4, low6]),
        )

    def _digest(self) -> bytes:
        if self._key is None:
            h = hashlib.blake2b(digest_size=16)
            for column in (self.family, self.length, self.high, self.low):
                value = _constant(column)  # the same digest whether stored once or not
                h.update(b"=%d" % value if value is not None else column.tobytes())
            self._key = h.digest()
        return self._key

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PrefixList):
            return len(self) == len(other) and self._digest() == other._digest()
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._digest())

    def __repr__(self) -> str:
        shown = ", ".join(str(p) for p in self[:3])
        return f"PrefixList({len(self)}: {shown}{', ...' if len(self) > 3 else ''})"


def _constant(column: Array) -> int | None:
    """The one value of a column whose entries are all alike (None if they differ;
    0 for an empty column)."""
    if not len(column):
        return 0
    first = column[0]
    if column.strides == (0,) or bool((column == first).all()):
        return int(first)
    return None


def _squeeze(column: Array) -> Array:
    """A column of like entries as one value, broadcast; any other as it is."""
    import numpy as np  # noqa: PLC0415

    value = _constant(column)
    if value is None:
        return column
    return np.broadcast_to(np.array(value, column.dtype), column.shape)


def _picked(column: Array, index: Any, count: int) -> Array:
    import numpy as np  # noqa: PLC0415

    if column.strides == (0,):
        return np.broadcast_to(column[:1].reshape(()) if len(column) else
                               np.array(0, column.dtype), (count,))  # fmt: skip
    return column[index]


def _joined(columns: list[Array]) -> Array:
    import numpy as np  # noqa: PLC0415

    values = {_constant(c) if c.strides == (0,) else None for c in columns}
    if len(values) == 1 and None not in values:
        total = sum(len(c) for c in columns)
        return np.broadcast_to(np.array(values.pop(), columns[0].dtype), (total,))
    return np.concatenate(columns)


def _mask_above(bits: Array) -> Array:
    """Per entry, a u64 with all but the lowest ``bits`` bits set (bits 0..64)."""
    import numpy as np  # noqa: PLC0415

    ones = np.full(bits.shape, _LOW, np.uint64)
    return np.where(bits >= 64, np.uint64(0), ones << np.minimum(bits, 63).astype(np.uint64))


# -- the rule-file reader -----------------------------------------------------------------


def read_rule_file(path: str) -> PrefixList:
    """Read a rule file: one CIDR per line, UTF-8."""
    data = read_input(path, "rule file", RULE_FILE_LIMIT)
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise AlfError(
                f"rule file {excerpt(path, 200, quote=False)}",
                f"not UTF-8 text ({err.reason} at byte {err.start})",
                "write one CIDR per line",
                EX_DATAERR,
            ) from None
    return parse_rule_bytes(data, path)


# Bytes that str.splitlines() also breaks lines at: a file with any of them (or any
# non-ASCII byte, for U+0085, U+2028, U+2029) is read line by line, as before, so that
# line numbers stay what an editor shows.
_OTHER_BREAKS = b"\r\x0b\x0c\x1c\x1d\x1e"
_CHUNK = 1 << 20  # bytes parsed in bulk at a time: bounds the temporaries (a few MiB)
LINE_LIMIT = 4096  # bytes in a line, comment included: a CIDR needs at most 43


def _too_long(origin: str, number: int, start: bytes | str) -> AlfError:
    text = start[:41].decode(errors="replace") if isinstance(start, bytes) else start
    return AlfError(f"{origin}:{number}", f"the line {excerpt(text)} is longer than "
                    f"{LINE_LIMIT} bytes", "write one CIDR per line", EX_DATAERR)  # fmt: skip


def parse_rule_bytes(data: bytes, origin: str) -> PrefixList:
    """A rule file's contents: one CIDR per line, ``#`` starts a comment."""
    if not data.isascii() or any(b in data for b in _OTHER_BREAKS):
        text = data.decode("utf-8")  # the caller checked that it decodes
        return PrefixList.of(parse_rule_lines(text.splitlines(), origin))
    parts: list[PrefixList] = []
    first_line, begin = 1, 0
    while begin < len(data):  # about _CHUNK bytes of whole lines at a time
        cut = min(begin + _CHUNK, len(data)) - 1
        # The line across the cut is looked for within LINE_LIMIT only: a longer one
        # would make the chunk, and the parse's temporaries (tens of bytes a byte), huge.
        end = data.find(b"\n", cut, cut + LINE_LIMIT + 1)
        if end < 0 and cut + LINE_LIMIT + 1 < len(data):
            start = data.rfind(b"\n", 0, cut) + 1
            raise _too_long(
                origin, first_line + data.count(b"\n", begin, start), data[start : start + 41]
            )
        end = len(data) if end < 0 else end + 1
        chunk = data[begin:end] if data[end - 1 : end] == b"\n" else data[begin:end] + b"\n"
        part, lines = _parse_chunk(chunk, first_line, origin)
        parts.append(part)
        first_line += lines
        begin = end
    return PrefixList.concat(parts)


def parse_rule_lines(lines: Iterable[str], origin: str, first: int = 1) -> list[Prefix]:
    """Rule-file lines, one at a time, numbered from ``first``."""
    prefixes = []
    for number, line in enumerate(lines, first):
        if len(line) > LINE_LIMIT:
            raise _too_long(origin, number, line)
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            prefixes.append(parse_prefix(text))
        except ValueError as err:
            raise AlfError(f"{origin}:{number}", str(err), "fix or remove that line",
                           EX_DATAERR) from None  # fmt: skip
    return prefixes


def _parse_chunk(chunk: bytes, first: int, origin: str) -> tuple[PrefixList, int]:
    """The prefixes of the lines of ``chunk`` (which ends with a newline), numbered
    from ``first``, and how many lines there were."""
    import numpy as np  # noqa: PLC0415

    a = np.frombuffer(chunk, np.uint8)
    digit = a - np.uint8(48)
    sep = np.flatnonzero(digit >= 10)  # every non-digit; the last is the final newline
    char = a[sep]
    is_end = char == 10
    newline = np.flatnonzero(is_end)  # index in sep of each line's end
    lines = len(newline)
    # A token is the run of digits before a separator: its last three digits, read back
    # from the separator (what lies before a shorter token is masked by its size).
    start = np.empty(len(sep), np.int64)
    start[0] = 0
    start[1:] = sep[:-1] + 1
    size = sep - start
    padded = np.zeros(len(a) + 3, np.uint16)
    padded[3:] = digit
    ones, tens, hundreds = padded[sep + 2], padded[sep + 1], padded[sep]
    value = ones + np.where(size >= 2, tens * 10, 0) + np.where(size >= 3, hundreds * 100, 0)
    # Only the canonical form is taken in bulk: 1 to 3 digits, no leading zero.
    leading = np.where(size == 3, hundreds, np.where(size == 2, tens, 1))
    token_ok = (size >= 1) & (size <= 3) & ((size == 1) | (leading != 0))

    # Per line: 4 tokens (a.b.c.d) or 5 (a.b.c.d/len), in that order, nothing else.
    count = np.empty(lines, np.int64)
    count[0:1] = newline[:1] + 1
    count[1:] = newline[1:] - newline[:-1]
    odd_char = (char != 46) & (char != 47) & ~is_end
    if odd_char.any():
        line_of_sep = np.cumsum(is_end) - is_end  # the line each separator ends in
        plain = np.bincount(line_of_sep[odd_char], minlength=lines) == 0
    else:
        plain = np.ones(lines, bool)
    blank = (count == 1) & (size[newline] == 0)
    first_token = newline - count + 1

    ok = plain & ((count == 4) | (count == 5))
    last = len(sep) - 1
    octets = np.zeros(lines, np.uint32)
    for k in range(4):
        at = np.minimum(first_token + k, last)
        part = value[at]
        ok &= token_ok[at] & (part <= 255)
        if k < 3:
            ok &= char[at] == 46
        octets = octets << np.uint32(8) | part
    has_length = count == 5
    at = np.minimum(first_token + 4, last)
    given = value[at]
    ok &= ~has_length | ((char[np.minimum(first_token + 3, last)] == 47) & token_ok[at]
                         & (given <= 32))  # fmt: skip
    length = np.where(has_length, given, 32).astype(np.uint8)
    host = np.uint64(0xFFFFFFFF) >> length.astype(np.uint64)
    ok &= (octets & host) == 0
    octets = octets.astype(np.uint64)

    family = np.where(ok, 4, 0).astype(np.uint8)
    high = np.zeros(lines, np.uint64)
    # The other lines, one at a time, each in its place among the bulk ones.
    rest = np.flatnonzero(~ok & ~blank)
    if len(rest):
        bounds = np.concatenate(([0], sep[newline] + 1))
        rows, found = [], []
        for i in rest.tolist():
            text = chunk[bounds[i] : bounds[i + 1] - 1].decode()
            for prefix in parse_rule_lines([text], origin, first + i):
                rows.append(i)
                found.append(prefix)
        family[rows] = [p.family for p in found]
        length[rows] = [p.length for p in found]
        high[rows] = [p.value >> 64 for p in found]
        octets[rows] = [p.value & _LOW for p in found]
    keep = np.flatnonzero(family)
    return PrefixList(family[keep], length[keep], high[keep], octets[keep]), lines
