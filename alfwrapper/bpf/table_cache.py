"""The table cache: a start whose rules are unchanged writes the subnet table an
earlier start built, without reading, parsing or laying out a rule.

Parsing a million rules, laying out their table and building it into the maps
costs a start most of a second of numpy (docs/benchmarks.md), and all of it is a
function of the rules.  So a start that builds a table of more than SMALL_RULES
rules keeps what it wrote into the maps, and the next start with the same rules
writes that instead: its rule files stay unread (read_rule_file's deferred lists)
and numpy stays unimported.

- **Key**: a SHA-256 of this format, the identities of the code that lays out and
  encodes the table and of the C that reads it (their device, inode, size and
  times: an upgrade or a patch misses), and the allow and deny lists' recipes
  (PrefixList.recipe: each rule file's path, identity and parser, each rule given
  one by one).  A list without a recipe (from a rule file changed within the last
  second, or through the loader) is not cached.
- **Kept**: in the cache folder (host/cachedir.py: this user's alone) as
  ``table-KEY``: each write the build made into the maps (the map, a byte offset and
  the bytes: the mmapable arrays), each batch update (the map, its keys and values:
  the IPv6 roots and deeper levels), then the plan's -D settings, the key, and a
  CRC-32 of it all.  Written while the table is built, so no second copy is held,
  and put in place whole or not at all (cachedir.Entry).
- **Used** only if it is this user's, at most ``MAX_ENTRY_BYTES``, its CRC-32 holds,
  its key is the one asked for and every write lies within its data; anything else
  is a miss, and the table is built (and kept) again.  The CRC-32 finds damage; it
  is no defence against whoever may write the folder, who chooses the program
  anyway (bpf/cache.py).  A SHA-256 over tens of MiB would cost a start 30 ms.
- **Bounded** with the program cache (bpf/cache.py: MAX_BYTES, MAX_ENTRIES, gc).
"""

from __future__ import annotations

import json
import os
import struct
import zlib

from alfwrapper import __version__
from alfwrapper.host import cachedir
from alfwrapper.policy.prefix_list import SMALL_RULES, PrefixList
from alfwrapper.policy.rules import SubnetRules
from alfwrapper.record import Record, field

FORMAT = 1
PREFIX = "table-"
MAX_ENTRY_BYTES = 192 << 20  # a 64 MiB rule file's table, with room
_TRAILER = struct.Struct("<II")  # the header's length, the CRC-32 of all before it
_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE)
# The code a table comes from: its layout and encoding (numpy's too), and the C that
# reads it (in either place bpf/program.filter_dir looks: the one not there is None).
_CODE = cachedir.code_identity(
    [os.path.join(_HERE, name) for name in ("table_cache.py", "subnet_table.py", "parts.py")]
    + [os.path.join(_PACKAGE, "policy", name) for name in ("prefix_list.py", "prefixes.py")]
    + [
        os.path.join(top, "filters", name)
        for top in (_PACKAGE, os.path.dirname(_PACKAGE))
        for name in ("subnets.c", "common.h")
    ],
    ("numpy",),
)

Defines = tuple[tuple[str, str], ...]


class Image(Record):
    """A table as its maps hold it: ``writes`` (map, byte offset, bytes) into the
    mmapable arrays, ``batches`` (map, count, keys, values) for the others."""

    name: str
    defines: Defines
    writes: tuple[tuple[str, int, memoryview], ...]
    batches: tuple[tuple[str, int, memoryview, memoryview], ...]


def key(subnets: SubnetRules) -> str | None:
    """The entry's name for these rules, or None: not cached (too few rules, no
    recipe, no cache folder)."""
    allow, deny = subnets.allow, subnets.deny
    if len(allow) + len(deny) <= SMALL_RULES or cachedir.directory() is None:
        return None
    recipes = [PrefixList.of(allow).recipe(), PrefixList.of(deny).recipe()]
    if None in recipes:
        return None
    material = "\0".join([str(FORMAT), __version__, _CODE, *map(str, recipes)])
    return PREFIX + cachedir.sha256(material.encode(errors="surrogateescape")).hexdigest()


def load(name: str) -> Image | None:
    """The image kept under ``name``, if it is sound (see the module's docstring)."""
    folder = cachedir.directory()
    raw = None if folder is None else cachedir.map_entry(folder, name, MAX_ENTRY_BYTES)
    if raw is None or len(raw) < _TRAILER.size:
        return None
    view = memoryview(raw)  # the views below keep the map open while they are used
    header_bytes, crc = _TRAILER.unpack_from(raw, len(raw) - _TRAILER.size)
    if zlib.crc32(view[: len(raw) - 4]) != crc:
        return None
    body_end = len(raw) - _TRAILER.size - header_bytes
    if body_end < 0:
        return None
    try:
        header = json.loads(bytes(view[body_end : len(raw) - _TRAILER.size]))
        if header["format"] != FORMAT or header["key"] != name:
            return None
        at = 0
        writes = []
        for map_name, offset, length in header["writes"]:
            writes.append((str(map_name), _count(offset), view[at : at + _count(length)]))
            at += length
        batches = []
        for map_name, count, key_bytes, value_bytes in header["batches"]:
            keys = view[at : at + _count(key_bytes)]
            values = view[at + key_bytes : at + key_bytes + _count(value_bytes)]
            batches.append((str(map_name), _count(count), keys, values))
            at += key_bytes + value_bytes
        if at != body_end:
            return None
        defines = tuple((str(n), str(v)) for n, v in header["defines"])
    except Exception:  # noqa: BLE001  (whatever is wrong with it, it is a miss)
        return None
    return Image(name, defines, tuple(writes), tuple(batches))


def forget(name: str) -> None:
    """Remove an entry the maps would not take (it passed its checks: a bug's, or
    written by someone who may write the folder), so that the next start builds."""
    folder = cachedir.directory()
    if folder is not None:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("not a count")
    return value


class Recorder(Record, frozen=False):
    """Keeps what a build writes into the maps, as it writes it, under ``name``."""

    name: str
    entry: cachedir.Entry | None = None
    writes: list[tuple[str, int, int]] = field(default_factory=list)
    batches: list[tuple[str, int, int, int]] = field(default_factory=list)
    crc: int = 0

    def __post_init__(self) -> None:
        folder = cachedir.directory()  # the entry's file is made at the first write
        self.entry = None if folder is None else cachedir.Entry(folder, MAX_ENTRY_BYTES)

    def _put(self, data: bytes | memoryview) -> None:
        assert self.entry is not None
        self.crc = zlib.crc32(data, self.crc)
        self.entry.write(data)

    def write(self, map_name: str, offset: int, data: bytes | memoryview) -> None:
        if self.entry is not None:
            self.writes.append((map_name, offset, len(memoryview(data).cast("B"))))
            self._put(data)

    def batch(self, map_name: str, count: int, keys: bytes, values: bytes) -> None:
        if self.entry is not None:
            self.batches.append((map_name, count, len(keys), len(values)))
            self._put(keys)
            self._put(values)

    def keep(self, defines: Defines) -> None:
        """Put the entry in place, with its header: once the maps hold the table."""
        if self.entry is None:
            return
        header = json.dumps({"format": FORMAT, "key": self.name, "defines": defines,
                             "writes": self.writes, "batches": self.batches}).encode()  # fmt: skip
        self._put(header)
        self._put(struct.pack("<I", len(header)))
        self.entry.write(struct.pack("<I", self.crc))
        if self.entry.commit(self.name, sync=False):  # a torn file fails its CRC-32
            from alfwrapper.bpf import cache  # noqa: PLC0415  (its bounds hold for both)

            cache.prune()

    def abandon(self) -> None:
        if self.entry is not None:
            self.entry.abandon()
