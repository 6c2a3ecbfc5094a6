"""Many prefixes without an object each: numpy columns, and the rule-file reader that fills them.

A million rules as a million Python objects took seconds to parse and hundreds
of MiB at start-up.  A PrefixList keeps them in four columns (family, length
and the value's high and low 64 bits: 18 bytes a rule) and makes a ``Prefix``
only when one is asked for; the subnet table reads the columns directly.

``parse_rule_bytes`` parses the lines that are a plain IPv4 address or CIDR, and
those that are an IPv6 one in hex groups (``_parse_v6``), in bulk with numpy, and
hands every other line (a dotted IPv4 tail, comments, spaces, anything it is not
sure of) to ``prefixes.parse_prefix`` one at a time, so that both ways
accept, refuse and number lines alike (tests/unit/test_prefix_list.py checks
that they agree).  A file of at most SMALL_RULES lines is read one line at a
time: importing numpy would cost such a start more than its parse.  numpy is
imported where used, so that a missing numpy is one clear line (cli).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

from alfwrapper.errors import EX_DATAERR, EX_SOFTWARE, EX_TEMPFAIL, AlfError, excerpt
from alfwrapper.host import cachedir
from alfwrapper.host.cachedir import Identity
from alfwrapper.policy.inputs import (
    RULE_FILE_LIMIT,
    consulted,
    here,
    read_identified,
    resolved,
)
from alfwrapper.policy.prefixes import Prefix, parse_prefix

Array = Any  # numpy arrays (typed loosely: Debian's numpy 1.24 and pip's 2.x check alike)

_LOW = (1 << 64) - 1
# Up to this many rules, a start imports no numpy (about 50 ms and 20 MiB): a rule file
# of at most this many lines is read one line at a time, and the subnet table of at
# most this many rules is laid out in plain Python (bpf/subnet_table.py).
SMALL_RULES = 64
_PACKED = struct.Struct("<II")  # packed(): the counts of IPv4 and IPv6 rules
_FEW = 4096  # prefixes given one by one whose text is their recipe()
Pieces = tuple["str | tuple[Prefix, ...]", ...]  # a join's recipe, before it is worked out


class PrefixList(Sequence[Prefix]):
    """An immutable sequence of prefixes held in numpy columns.

    A column whose entries are all alike is stored once (a broadcast view), and the
    low half as u32 when every value fits: IPv4 rules cost 5 bytes each.  A list made
    from Prefix objects (of, concat of such) keeps them and makes its columns only
    when first asked: judging a peer by a few rules (an Accept=yes connection,
    SubnetRules.passes) never loads numpy."""

    __slots__ = ("_columns", "_count", "_deferred", "_items", "_key", "_origin", "_pieces")
    COLUMNS = ("family", "length", "high", "low")

    def __init__(self, family: Array, length: Array, high: Array, low: Array) -> None:
        import numpy as np  # noqa: PLC0415

        family, high = _squeeze(family), _squeeze(high)
        if low.dtype != np.uint32 and _constant(high) == 0 and not (low >> np.uint64(32)).any():
            low = low.astype(np.uint32)
        for column in (family, length, high, low):
            if column.strides != (0,):
                column.flags.writeable = False
        self._columns: tuple[Array, Array, Array, Array] | None = (family, length, high, low)
        self._items: tuple[Prefix, ...] | None = None
        self._key: bytes | None = None
        self._origin: str | None = None  # recipe()
        self._deferred: Callable[[], PrefixList] | None = None
        self._count = 0  # len() while deferred
        self._pieces: Pieces | None = None  # a join's parts, for recipe()

    @classmethod
    def of(cls, prefixes: Iterable[Prefix]) -> PrefixList:
        if isinstance(prefixes, PrefixList):
            return prefixes
        made = cls.__new__(cls)
        made._columns, made._items, made._key = None, tuple(prefixes), None
        made._origin, made._deferred, made._count, made._pieces = None, None, 0, None
        return made

    @classmethod
    def deferred(cls, load: Callable[[], PrefixList], count: int, origin: str) -> PrefixList:
        """A list of ``count`` prefixes that ``load`` gives when first looked into:
        until then, its length and its recipe() are known, and nothing is read,
        parsed or imported (a start whose subnet table is cached: bpf/table_cache.py)."""
        made = cls.__new__(cls)
        made._columns, made._items, made._key = None, None, None
        made._origin, made._deferred, made._count, made._pieces = origin, load, count, None
        return made

    def _settle(self) -> None:
        """A deferred list loaded, once."""
        if self._deferred is not None:
            loaded = self._deferred()  # as long as it said (read_rule_file checks)
            self._columns, self._items, self._deferred = loaded._columns, loaded._items, None

    def recipe(self) -> str | None:
        """A name of this list's contents, found without looking into them: of a rule
        file (its path, identity and parser: read_rule_file), of a few prefixes given
        one by one (their text), or of a concatenation of such; None for any other
        list.  Each is a tag and a SHA-256, so no two kinds or joins can meet."""
        if self._pieces is not None and self._origin is None:  # worked out when asked
            self._origin = _joined_recipe(self._pieces)
        if self._origin is not None:
            return self._origin
        if self._items is not None and len(self._items) <= _FEW:
            return recipe_of("list", " ".join(str(p) for p in self._items))
        return None

    def fingerprint(self, cheap: bool = True) -> str:
        """A name of this list's contents that another process finds again.  ``cheap``:
        its recipe where that is made of settled rule files alone (by path and
        identity: nothing is read, and a later process gives it too while they are
        unchanged); otherwise, or unless ``cheap``, its contents' name: a few prefixes
        by their text (as their recipe names them: no numpy for a start of a few
        rules), more by a digest of their columns."""
        pieces = self._as_pieces() if cheap else None
        if pieces and all(isinstance(p, str) and p.startswith("file:") for p in pieces):
            return self.recipe() or ""
        if len(self) <= _FEW:
            return recipe_of("list", " ".join(str(p) for p in self))
        return "digest:" + self._digest().hex()

    def _as_pieces(self) -> Pieces | None:
        """This list as parts of a join's recipe: a join's own parts (so that a join of
        joins names what a flat join of the same parts names), a recipe, or a few
        prefixes; None if it has no recipe."""
        if self._pieces is not None:
            return self._pieces
        if self._origin is not None:
            return (self._origin,)
        if self._items is not None and len(self._items) <= _FEW:
            return (self._items,)
        return None

    def _made(self) -> tuple[Array, Array, Array, Array]:
        self._settle()
        if self._columns is None:
            import numpy as np  # noqa: PLC0415

            items = self._items or ()
            n = len(items)
            columns = PrefixList(
                np.fromiter((p.family for p in items), np.uint8, n),
                np.fromiter((p.length for p in items), np.uint8, n),
                np.fromiter((p.value >> 64 for p in items), np.uint64, n),
                np.fromiter((p.value & _LOW for p in items), np.uint64, n),
            )._columns
            assert columns is not None
            self._columns = columns
        return self._columns

    family = property(lambda self: self._made()[0])
    length = property(lambda self: self._made()[1])
    high = property(lambda self: self._made()[2])
    low = property(lambda self: self._made()[3])

    @classmethod
    def concat(cls, parts: Iterable[Sequence[Prefix]]) -> PrefixList:
        """The parts one after the other; the only non-empty part itself, not a copy."""

        lists = [cls.of(p) for p in parts if len(p)]
        if len(lists) == 1:
            return lists[0]
        if not lists:
            return cls.of(())
        gathered: list[str | tuple[Prefix, ...]] | None = []
        for p in lists:
            more = p._as_pieces()
            if more is None or gathered is None:
                gathered = None
                break
            gathered.extend(more)
        pieces = None if gathered is None else tuple(gathered)
        if pieces is not None and any(p._deferred is not None for p in lists):
            count = sum(map(len, lists))
            made = cls.deferred(lambda: cls._joined(lists), count, _joined_recipe(pieces))
            made._pieces = pieces
            return made
        joined = cls._joined(lists)
        joined._pieces = pieces
        return joined

    @classmethod
    def _joined(cls, lists: list[PrefixList]) -> PrefixList:
        for p in lists:
            p._settle()
        if all(p._items is not None for p in lists):
            return cls.of(item for p in lists for item in p._items or ())
        return cls(*(_joined([getattr(p, c) for p in lists]) for c in cls.COLUMNS))

    def __add__(self, other: Sequence[Prefix]) -> PrefixList:
        return PrefixList.concat([self, other])

    def __radd__(self, other: Sequence[Prefix]) -> PrefixList:
        return PrefixList.concat([other, self])

    def __len__(self) -> int:
        if self._deferred is not None:
            return self._count
        return len(self._items) if self._items is not None else len(self.family)

    @overload
    def __getitem__(self, index: int) -> Prefix: ...
    @overload
    def __getitem__(self, index: slice) -> PrefixList: ...
    def __getitem__(self, index: int | slice) -> Prefix | PrefixList:
        if isinstance(index, slice):
            return self.take(index)
        self._settle()
        if self._items is not None:
            return self._items[index]
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
        self._settle()
        if self._items is not None:
            yield from self._items
            return
        columns = (
            self.family.tolist(),
            self.high.tolist(),
            self.low.tolist(),
            self.length.tolist(),
        )
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
        width = 32 if family == 4 else 128
        self._settle()
        if self._items is not None and self._columns is None:  # a few, as they were given
            return PrefixList.of(
                p
                for p in self._items
                if p.family == family and (p.value ^ value) >> (width - p.length) == 0
            )
        import numpy as np  # noqa: PLC0415

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
        self._settle()
        if self._items is not None and self._columns is None:
            return PrefixList.of(p for p in self._items if p.family == family)
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
            import hashlib  # noqa: PLC0415  (a denied inetd peer never hashes)

            h = hashlib.blake2b(digest_size=16)
            for column in (self.family, self.length, self.high, self.low):
                value = _constant(column)  # the same digest whether stored once or not
                h.update(b"=%d" % value if value is not None else column.tobytes())
            self._key = h.digest()
        return self._key

    def __eq__(self, other: object) -> bool:
        if (
            isinstance(other, PrefixList)
            and self._origin is not None
            and (
                self._origin == other._origin  # the same file, unchanged: the same prefixes
            )
        ):
            return True
        if isinstance(other, PrefixList):
            return len(self) == len(other) and self._digest() == other._digest()
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(len(self))  # as __eq__ holds: a deferred list is not read for it

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
        return np.broadcast_to(
            column[:1].reshape(()) if len(column) else np.array(0, column.dtype), (count,)
        )
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
    """Read a rule file: one CIDR per line, UTF-8.

    A file of more than SMALL_RULES rules that an earlier start parsed, unchanged
    since (its identity, host/cachedir.py: device, inode, size, modification and
    change times) is not read: the list is deferred, of the length that start noted
    in the cache folder (``rules-KEY``), and read only if something looks into it.
    A start whose subnet table is cached too (bpf/table_cache.py) never does."""
    before = resolved(path)
    noted = _recall(path)
    if noted is not None:
        ident, count, origin, note = noted
        consulted(path, ident, before)
        where = here(path)  # read later, perhaps from another working directory (reload)

        def load() -> PrefixList:
            prefixes = _read_rule_file(where, ident, shown=path)[0]
            if len(prefixes) != count:  # a wrong note: never start on it, nor again
                _forget(note)
                raise AlfError(
                    f"rule file {excerpt(path, 200, quote=False)}",
                    f"holds {len(prefixes)} rules, not the {count} the cache noted",
                    "start again (the note is removed)",
                    EX_SOFTWARE,
                )
            return prefixes

        return PrefixList.deferred(load, count, recipe_of("file", origin))
    prefixes, ident = _read_rule_file(path, None)
    if ident is not None and cachedir.settled(ident, time.time_ns()):
        origin = _origin(path, ident)
        prefixes._origin = recipe_of("file", origin)
        if len(prefixes) > SMALL_RULES:
            _note(origin, len(prefixes))
    return prefixes


def _joined_recipe(pieces: Pieces) -> str:
    text = (p if isinstance(p, str) else "list " + " ".join(map(str, p)) for p in pieces)
    return recipe_of("join", "\n".join(text))  # recipes and prefixes hold no newline


def recipe_of(kind: str, text: str) -> str:
    return f"{kind}:{cachedir.sha256(text.encode(errors='surrogateescape')).hexdigest()}"


# A note: "rules-" and the SHA-256 of the file's origin; its SHA-256, then the format,
# the count and the origin.  Sealed: a wrong count could drop a file's rules unseen.
_NOTE_PREFIX = "rules-"
_NOTE_FORMAT = b"1"
_NOTE_LIMIT = 8192
# The parser's code (and numpy's, which parses in bulk): an upgrade misses.
_PARSER = cachedir.code_identity(
    [
        os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
        for name in ("prefix_list.py", "prefixes.py")
    ],
    ("numpy",),
)


def _origin(path: str, ident: Identity) -> str:
    return f"file {here(path)!r} {ident} {_PARSER}"


def _forget(note: str) -> None:
    try:
        os.unlink(note)
    except OSError:
        pass


def _recall(path: str) -> tuple[Identity, int, str, str] | None:
    """The identity, count and origin of the file as a note has them, and the note's
    path; None if there is no sound note for the file as it is now."""
    folder = cachedir.directory()
    ident = cachedir.identity_opened(path)
    if folder is None or ident is None or not cachedir.settled(ident, time.time_ns()):
        return None
    origin = _origin(path, ident)
    name = _NOTE_PREFIX + cachedir.sha256(origin.encode(errors="surrogateescape")).hexdigest()
    raw = cachedir.read_entry(folder, name, _NOTE_LIMIT)
    if raw is None or len(raw) < 32 or cachedir.sha256(raw[32:]).digest() != raw[:32]:
        return None
    fields = raw[32:].split(b" ", 2)
    if len(fields) != 3 or fields[0] != _NOTE_FORMAT or not fields[1].isdigit():
        return None
    if fields[2] != origin.encode(errors="surrogateescape") or int(fields[1]) <= SMALL_RULES:
        return None
    return ident, int(fields[1]), origin, os.path.join(folder, name)


def _note(origin: str, count: int) -> None:
    folder = cachedir.directory()
    if folder is None:
        return
    text = origin.encode(errors="surrogateescape")
    body = b"%s %d %s" % (_NOTE_FORMAT, count, text)
    name = _NOTE_PREFIX + cachedir.sha256(text).hexdigest()
    cachedir.write_entry(folder, name, cachedir.sha256(body).digest() + body)


def _read_rule_file(path: str, expected: Identity, shown: str = "") -> tuple[PrefixList, Identity]:
    """The file read and parsed, and its identity; an error if it is not ``expected``
    (when given: a deferred list's file, changed since its identity was taken).
    ``shown``: the path as the user gave it, for messages."""
    shown = shown or path
    data, ident = read_identified(path, "rule file", RULE_FILE_LIMIT, shown)
    if expected is not None and ident != expected:
        raise AlfError(
            f"rule file {excerpt(shown, 200, quote=False)}",
            "changed while alfwrapper was starting",
            "start it again",
            EX_TEMPFAIL,
        )
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise AlfError(
                f"rule file {excerpt(shown, 200, quote=False)}",
                f"not UTF-8 text ({err.reason} at byte {err.start})",
                "write one CIDR per line",
                EX_DATAERR,
            ) from None
    return parse_rule_bytes(data, shown), ident


# Bytes that str.splitlines() also breaks lines at: a file with any of them (or any
# non-ASCII byte, for U+0085, U+2028, U+2029) is read line by line, as before, so that
# line numbers stay what an editor shows.
_OTHER_BREAKS = b"\r\x0b\x0c\x1c\x1d\x1e"
_CHUNK = 1 << 20  # bytes parsed in bulk at a time: bounds the temporaries (a few MiB)
LINE_LIMIT = 4096  # bytes in a line, comment included: a CIDR needs at most 43


def _too_long(origin: str, number: int, start: bytes | str) -> AlfError:
    text = start[:41].decode(errors="replace") if isinstance(start, bytes) else start
    return AlfError(
        f"{origin}:{number}",
        f"the line {excerpt(text)} is longer than {LINE_LIMIT} bytes",
        "write one CIDR per line",
        EX_DATAERR,
    )


def parse_rule_bytes(data: bytes, origin: str, few: int = SMALL_RULES) -> PrefixList:
    """A rule file's contents: one CIDR per line, ``#`` starts a comment.  A file of at
    most ``few`` lines, no longer than so many lines can be, is read one line at a
    time, without numpy."""
    # A file of at most ``few`` lines that a reader takes is at most this long; any
    # longer one (a huge line, a flood of lines) goes in bulk, bounded per chunk.
    short = len(data) <= few * (LINE_LIMIT + 1)
    if short and data.count(b"\n") + (not data.endswith(b"\n")) <= few:
        return PrefixList.of(parse_rule_lines(data.decode("utf-8").splitlines(), origin))
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
            raise AlfError(
                f"{origin}:{number}", str(err), "fix or remove that line", EX_DATAERR
            ) from None
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
    # Any: numpy 2's stubs (Debian 13) give each np.where below a shape of its own.
    octets: Any = np.zeros(lines, np.uint32)
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
    ok &= ~has_length | (
        (char[np.minimum(first_token + 3, last)] == 47) & token_ok[at] & (given <= 32)
    )
    length = np.where(has_length, given, 32).astype(np.uint8)
    host = np.uint64(0xFFFFFFFF) >> length.astype(np.uint64)
    ok &= (octets & host) == 0
    octets = octets.astype(np.uint64)

    family = np.where(ok, 4, 0).astype(np.uint8)
    high: Any = np.zeros(lines, np.uint64)
    if (char == 58).any():  # a colon: IPv6 lines, in bulk too
        ok6, length6, high6, low6 = _parse_v6(a, lines)
        # IPv4-mapped prefixes become IPv4 ones, as parse_prefix makes them.
        mapped = ok6 & (high6 == 0) & ((low6 >> np.uint64(32)) == 0xFFFF) & (length6 >= 96)
        family = np.where(mapped, 4, np.where(ok6, 6, family)).astype(np.uint8)
        length = np.where(mapped, length6 - 96, np.where(ok6, length6, length)).astype(np.uint8)
        high = np.where(ok6 & ~mapped, high6, high)
        octets = np.where(mapped, low6 & np.uint64(0xFFFFFFFF), np.where(ok6, low6, octets))
        ok = ok | ok6
    # The other lines, one at a time, each in its place among the bulk ones.
    rest = np.flatnonzero(~ok & ~blank)
    if len(rest):
        bounds = np.concatenate(([0], sep[newline] + 1))
        rows, found = [], []
        for i in map(int, rest):
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


_HEX_DIGITS = b"0123456789abcdef"
_NOT_HEX = 255


def _parse_v6(a: Array, lines: int) -> tuple[Array, Array, Array, Array]:
    """The lines of a chunk (bytes ``a``, ``lines`` lines, each ending in a newline) that
    are an IPv6 address or CIDR written in hex groups (``2001:db8::/64``, ``::1``,
    ``::ffff:c000:200/120``), in bulk: per line, whether it is one, its length, and
    its value's high and low 64 bits.  Only what ``ipaddress`` takes, and only in a
    form this reads for sure: 1 to 4 hex digits a group, at most one ``::``, a
    canonical decimal length, host bits zero.  Anything else (a dotted IPv4 tail, a
    scope id, spaces, a comment, an error) is left to the line-by-line parser."""
    import numpy as np  # noqa: PLC0415

    table = np.full(256, _NOT_HEX, np.uint8)
    table[np.frombuffer(_HEX_DIGITS, np.uint8)] = np.arange(16, dtype=np.uint8)
    table[np.frombuffer(_HEX_DIGITS[10:].upper(), np.uint8)] = np.arange(10, 16, dtype=np.uint8)
    digit = table[a]
    sep = np.flatnonzero(digit == _NOT_HEX)  # every non-hex byte; the last is a newline
    char = a[sep]
    is_end = char == 10
    newline = np.flatnonzero(is_end)
    line_of = np.cumsum(is_end) - is_end  # the line each separator ends in
    start = np.empty(len(sep), np.int64)
    start[0] = 0
    start[1:] = sep[:-1] + 1
    size = sep - start
    # The token before each separator: its last four digits, read back from it.
    padded = np.zeros(len(a) + 4, np.uint64)
    padded[4:] = np.where(digit == _NOT_HEX, 0, digit)
    d = [padded[sep + 3 - k] for k in range(4)]  # d[0] the last digit
    group = d[0].copy()
    for k in range(1, 4):
        group |= np.where(size > k, d[k] << np.uint64(4 * k), np.uint64(0))

    def per_line(mask: Array) -> Array:
        return np.bincount(line_of[mask], minlength=lines)

    colon, slash = char == 58, char == 47
    ok = per_line(~(colon | slash | is_end)) == 0  # hex, colons, one "/" before the end
    before_end = np.maximum(newline - 1, 0)
    has_length = (per_line(slash) == 1) & slash[before_end] & (newline > 0)
    ok &= per_line(slash) == (has_length * 1)
    colons = per_line(colon)
    ok &= (colons >= 2) & (colons <= 8)
    # The address's groups: the tokens before each colon, and the one before the "/"
    # (or the newline).  Where a group is empty, "::" stands.
    address = colon | slash | (is_end & ~has_length[line_of])
    ok &= per_line(address & (size > 4)) == 0
    empty = address & (size == 0)
    empties = per_line(empty)
    first_of_line = np.zeros(lines + 1, np.int64)
    first_of_line[1:] = np.cumsum(per_line(address))
    index = np.cumsum(address) - 1 - first_of_line[line_of]  # the group's place in its line
    gap_from = np.full(lines, 99, np.int64)
    gap_to = np.full(lines, -1, np.int64)
    at = np.flatnonzero(empty)  # in order, so a line's empty groups are next to each other
    its = line_of[at]
    first = np.ones(len(at), bool)
    first[1:] = its[1:] != its[:-1]
    final = np.ones(len(at), bool)
    final[:-1] = its[1:] != its[:-1]
    gap_from[its[first]] = index[at[first]]
    gap_to[its[final]] = index[at[final]]
    last = colons  # the index of the last group
    ok &= np.select(
        [empties == 0, empties == 1, empties == 2, empties == 3],
        [
            colons == 7,  # eight groups
            (gap_from > 0) & (gap_from < last) & (colons <= 7),  # a::b
            (((gap_from == 0) & (gap_to == 1)) | ((gap_from == last - 1) & (gap_to == last)))
            & (colons <= 8),  # ::a, a::
            colons == 2,  # ::
        ],
        False,
    )
    # Each group into its place of eight: before the gap from the left, after it from
    # the right.
    place = np.where(index < gap_from[line_of], index, 7 - (last[line_of] - index))
    keep = np.flatnonzero(address & ~empty & ok[line_of])
    groups = np.zeros((lines, 8), np.uint64)
    groups[line_of[keep], place[keep]] = group[keep]
    sixteen = np.uint64(16)
    high = ((groups[:, 0] << sixteen | groups[:, 1]) << sixteen | groups[:, 2]) << sixteen
    high |= groups[:, 3]
    low = ((groups[:, 4] << sixteen | groups[:, 5]) << sixteen | groups[:, 6]) << sixteen
    low |= groups[:, 7]
    # The length: the token before the newline, 1 to 3 decimal digits, no leading zero.
    tail = newline
    tail_size = size[tail]
    decimal = (
        (d[0][tail] < 10)
        & ((tail_size < 2) | (d[1][tail] < 10))
        & ((tail_size < 3) | (d[2][tail] < 10))
    )
    leading = np.where(tail_size == 3, d[2][tail], np.where(tail_size == 2, d[1][tail], 1))
    value = d[0][tail] + np.where(tail_size >= 2, d[1][tail] * np.uint64(10), np.uint64(0))
    value += np.where(tail_size >= 3, d[2][tail] * np.uint64(100), np.uint64(0))
    canonical = decimal & (tail_size >= 1) & (tail_size <= 3) & (leading != 0) & (value <= 128)
    ok &= ~has_length | canonical
    length = np.where(has_length, value, np.uint64(128)).astype(np.int64)
    shift = 128 - length
    keep_high = _mask_above(np.clip(shift - 64, 0, 64))
    keep_low = _mask_above(np.clip(shift, 0, 64))
    ok &= ((high & ~keep_high) == 0) & ((low & ~keep_low) == 0)  # host bits: the error's
    return ok, length, high, low
