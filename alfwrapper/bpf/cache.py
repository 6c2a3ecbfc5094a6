"""The program cache: a start whose program was compiled before loads it without BCC.

What BCC produced for a plan is kept: each map's shape and C types
(tables.MapSpec) and each program's instructions, with the places where an
instruction names a map (a 64-bit load of a map fd, BPF_PSEUDO_MAP_FD).  A
later start with the same plan makes fresh maps of the same shapes, writes
their fds into those places and loads the instructions; the kernel's verifier
checks them as it checks a compiled program.  Neither BCC nor LLVM is loaded.

- **Key**: a SHA-256 of everything the instructions depend on: the composed
  C and its -D settings (so the rules' sizes, the parts and a developer's
  filter's text), the entry functions, BCC's version, the kernel headers BCC
  used, the running kernel, and this format.  A change to any one misses.
- **Where**: the cache folder (host/cachedir.py: ``ALFWRAPPER_CACHE``, the unit's
  ``CacheDirectory=``, or root's ``/var/cache/alfwrapper/programs``), which must
  be this user's and closed to others, or the cache is not used: whoever may
  write an entry chooses the program.
- **Verified**: an entry is read only if it is a regular file of this user,
  at most ``MAX_ENTRY_BYTES`` (cachedir.read_entry); its SHA-256 over the content must match, and
  its key the one asked for.  Anything else is a miss: the program is
  compiled again and the entry replaced.  A cached program the kernel
  refuses is compiled again too.
- **Bounded**: at most ``MAX_ENTRIES`` entries and ``MAX_BYTES``; the least
  recently used go first, after each store and in `alfwrapper gc`, which also
  removes entries not used for a month (those of a kernel or BCC since replaced).

Entries are written whole or not at all (cachedir.write_entry).  The folder also
holds peers' verdicts (lifecycle/verdicts.py, ``verdict-*``), bounded with these.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import time
from pathlib import Path
from typing import Any

from alfwrapper.bpf.tables import MapSpec
from alfwrapper.host import cachedir
from alfwrapper.host.cachedir import read_entry, usable, write_entry
from alfwrapper.record import Record, as_dict

FORMAT = 1
MAX_ENTRY_BYTES = 16 << 20
MAX_ENTRIES = 256
MAX_BYTES = 512 << 20  # with the subnet tables (table_cache.py): tens of MiB each
GC_UNUSED_SECONDS = 30 * 86400  # `alfwrapper gc` removes entries not used for a month
SYSTEM_DIR = Path(cachedir.SYSTEM_DIR)


def directory() -> Path | None:
    """The cache folder (host/cachedir.py), if this process has one."""
    found = cachedir.directory()
    return None if found is None else Path(found)


_LD_IMM64 = 0x18
_PSEUDO_MAP_FD = 1
_INSN = struct.Struct("<BBhi")


class CachedProgram(Record):
    """One program: its instructions, and (instruction index, map name) of each map fd."""

    name: str
    insns: bytes
    relocations: tuple[tuple[int, str], ...]

    def with_fds(self, fds: dict[str, int]) -> bytes:
        """The instructions with these maps' fds written in."""
        code = bytearray(self.insns)
        for index, name in self.relocations:
            op, regs, off, _ = _INSN.unpack_from(code, index * 8)
            _INSN.pack_into(code, index * 8, op, regs, off, fds[name])
        return bytes(code)


class Entry(Record):
    maps: tuple[MapSpec, ...]
    programs: tuple[CachedProgram, ...]


def relocations(insns: bytes, names: dict[int, str]) -> tuple[tuple[int, str], ...] | None:
    """Where these instructions name a map by fd, and which (``names``: fd -> name);
    None if one names an fd that is not one of the maps (not cacheable)."""
    found = []
    for index in range(len(insns) // 8):
        op, regs, _, imm = _INSN.unpack_from(insns, index * 8)
        if op == _LD_IMM64 and regs >> 4:
            if regs >> 4 != _PSEUDO_MAP_FD or imm not in names:
                return None
            found.append((index, names[imm]))
    return tuple(found)


def _bcc_version() -> str:
    """BCC's version, read from its package without importing it (that loads LLVM)."""
    from importlib.util import find_spec  # noqa: PLC0415  (every finder: sys.meta_path too)

    spec = find_spec("bcc")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    for folder in spec.submodule_search_locations:
        try:
            return Path(folder, "version.py").read_text(encoding="utf-8").strip()
        except OSError:
            continue
    return "unknown"


def key(text: str, cflags: list[str], entries: list[str], headers: str) -> str:
    """The cache key of a program: everything its instructions depend on."""
    uname = os.uname()
    facts = [str(FORMAT), _bcc_version(), uname.release, uname.version, headers,
             *entries, *cflags, text]  # fmt: skip
    return cachedir.sha256("\0".join(facts).encode()).hexdigest()


def _seal(body: dict[str, Any]) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"sha256": cachedir.sha256(text.encode()).hexdigest(), "body": text}).encode()


def load(key_: str) -> Entry | None:
    """The entry under this key, if there is a sound one; None otherwise."""
    folder = directory()
    raw = None if folder is None else read_entry(str(folder), key_, MAX_ENTRY_BYTES)
    if raw is None:
        return None
    try:
        sealed = json.loads(raw)
        text = sealed["body"]
        if cachedir.sha256(text.encode()).hexdigest() != sealed["sha256"]:
            return None
        body = json.loads(text)
        if body["format"] != FORMAT or body["key"] != key_:
            return None
        entry = Entry(
            tuple(MapSpec(**spec) for spec in body["maps"]),
            tuple(
                CachedProgram(
                    p["name"],
                    base64.b64decode(p["insns"]),
                    tuple((int(i), str(n)) for i, n in p["relocations"]),
                )
                for p in body["programs"]
            ),
        )
    except (ValueError, KeyError, TypeError):
        return None
    names = {spec.name for spec in entry.maps}
    if any(n not in names for p in entry.programs for _, n in p.relocations):
        return None
    return entry


def store(key_: str, entry: Entry) -> None:
    """Keep an entry under its key (replacing any), then hold the cache to its bounds.
    A cache that cannot be written is no error: the next start compiles."""
    folder = directory()
    if folder is None:
        return
    body = {
        "format": FORMAT,
        "key": key_,
        "maps": [as_dict(spec) for spec in entry.maps],
        "programs": [
            {
                "name": p.name,
                "insns": base64.b64encode(p.insns).decode(),
                "relocations": [list(r) for r in p.relocations],
            }
            for p in entry.programs
        ],
    }
    if write_entry(str(folder), key_, _seal(body)):
        prune(folder)


def prune(
    folder: Path | None = None,
    keep: int = MAX_ENTRIES,
    size: int = MAX_BYTES,
    unused_for: float = float("inf"),
) -> int:
    """Remove the least recently used entries beyond the bounds, those not used for
    ``unused_for`` seconds (`alfwrapper gc`: a month), and leftovers of interrupted
    stores; how many files were removed."""
    folder = folder or directory()
    if folder is None or not usable(str(folder), create=False):
        return 0
    entries, removed = [], 0
    for item in folder.iterdir():
        try:
            info = item.lstat()
        except OSError:
            continue
        if item.name.startswith(".new-"):  # a store under way, or a crashed one's leftover
            if time.time() - info.st_mtime > 60:
                entries.append((0.0, 0, item))
        else:
            entries.append((info.st_mtime, info.st_size, item))
    entries.sort(reverse=True, key=lambda e: e[0])
    total = 0
    for index, (used, bytes_, item) in enumerate(entries):
        total += bytes_
        if used and index < keep and total <= size and time.time() - used < unused_for:
            continue
        try:
            item.unlink()
            removed += 1
        except OSError:
            pass
    return removed
