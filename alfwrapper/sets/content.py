"""What a set holds: its entries (whole addresses in the hash, ranges in the trie,
each with its expiry), their keys and values as sets.c reads them, changed under the
set's lock (add, hold, assign, delete, flush, sweep), read (entries, count,
holding), the hosts map grown while programs use it, and the sieve kept in step."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from operator import itemgetter
from typing import Any, cast

from alfwrapper.bpf.parts import (
    SET_EXPIRY,
    SET_HOST,
    SET_HOST_FIELDS,
    SET_RANGE,
    SET_ROLES,
    SIEVE_MIX,
    bpf_map_put_fd,
    c_offsets,
    sieve_fits,
    sieve_header,
)
from alfwrapper.errors import EX_CONFIG, AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.host.faults import crash_point
from alfwrapper.policy.prefix_list import Array
from alfwrapper.policy.prefixes import FAMILY_BITS, Prefix
from alfwrapper.sets.bloom import (
    BATCH,
    M64,
    Sieved,
    set_header,
    shift_of,
    sieve_add,
    sieve_exact,
    sieved,
    spots_of,
    words_of,
)
from alfwrapper.sets.tree import (
    GROWN,
    MOST_SIZE,
    Maps,
    fail,
    folder,
    hosts_in_force,
    locked,
    new_map,
    open_role,
    pin,
    repair,
)


def now_ns() -> int:
    """The clock sets.c compares expiries with (CLOCK_MONOTONIC; the kernel's coarse
    reading of it lags by a tick at most)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@contextmanager
def _opened(name: str, changing: bool = True) -> Iterator[Maps]:
    """The set's maps; ``changing``: under the set's lock, so that a sweep, which
    reads an entry as lapsed and then deletes it, never deletes what another process
    wrote in between (a deny entry lost), and no two change the sieve at once."""
    fds: Maps = {}
    try:
        for role in SET_ROLES:
            fds[role] = open_role(name, role)
        if changing:
            with locked(folder(name)) as at:
                repair(name, fds, at)
                if not sieve_fits(fds["hosts_at"], fds["sieve"]):  # an older alfwrapper's
                    resieve(fds)  # change: rebuilt before anything is added
                fds[_FOLDER] = at
                try:
                    yield fds
                finally:
                    del fds[_FOLDER]  # locked closes it
        else:
            yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


_FOLDER = "folder"  # in a changing _opened's Maps: the set's folder, open and locked


def _key(prefix: Prefix) -> tuple[str, bytes]:
    """The map a prefix goes in, and its key there."""
    width = FAMILY_BITS[prefix.family]
    raw = prefix.value.to_bytes(width // 8, "big").ljust(16, b"\0")
    if prefix.length == width:
        return "hosts", SET_HOST.pack(width, prefix.family, b"", raw)
    return "ranges", SET_RANGE.pack(32 + prefix.length, prefix.family, b"", raw)


def _prefix(role: str, key: bytes) -> Prefix:
    if role == "hosts":
        length, family, _, raw = SET_HOST.unpack(key)
    else:
        bits, family, _, raw = SET_RANGE.unpack(key)
        length = bits - 32
    width = FAMILY_BITS.get(family, 128)
    return Prefix(family, int.from_bytes(raw[: width // 8], "big"), length)


def _value(prefix: Prefix, expiry: int) -> bytes:
    """An entry's value (sets.c): its expiry; a range's rounded up to 256 ns, with its
    prefix length in the low 8 bits (the kernel looks past a lapsed range by it)."""
    if prefix.length == FAMILY_BITS[prefix.family]:
        return SET_EXPIRY.pack(expiry)
    return SET_EXPIRY.pack(((expiry + 0xFF) & ~0xFF) | prefix.length)


def _expiry(role: str, raw: bytes) -> int:
    value = int(SET_EXPIRY.unpack(raw)[0])
    return value if role == "hosts" else value & ~0xFF


def _host_record(family: int) -> dict[str, object]:
    """SET_HOST for a whole address of this family, as a numpy record (_hosts), read
    from SET_HOST_FIELDS: its address in network order, as one ">u4" or two ">u8",
    the bytes not named zero."""
    offsets = c_offsets(SET_HOST_FIELDS)
    addr = offsets["addr"]
    six = [("hi", ">u8", addr), ("lo", ">u8", addr + 8)]
    words = [("addr", ">u4", addr)] if family == 4 else six
    fields = [("length", "u1", offsets["length"]), ("family", "u1", offsets["family"]), *words]
    return {
        "names": [f[0] for f in fields],
        "formats": [f[1] for f in fields],
        "offsets": [f[2] for f in fields],
        "itemsize": SET_HOST.size,
    }


def put(name: str, fds: Maps, prefixes: Sequence[Prefix], expiry: int) -> None:
    sieve = fds["sieve"]
    sieve_add(sieve, sieved(shift_of(sieve), prefixes))  # before the entries (sets' doc)
    crash_point("set-bits-set")
    for prefix in prefixes:
        role, key = _key(prefix)
        _update(name, fds, role, key, _value(prefix, expiry))


def _update(name: str, fds: Maps, role: str, key: bytes, value: bytes) -> None:
    """One entry in; a full map first loses its lapsed entries, then a full hosts map
    grows (_grow); a trie full at MOST_SIZE is an error."""
    try:
        bpf_calls.map_update(fds[role], key, value)
    except OSError as err:
        if err.errno not in (errno.E2BIG, errno.ENOSPC):
            raise
        if not _sweep(fds[role], role):
            if role != "hosts":
                raise AlfError(
                    f"set {name}",
                    f"its {role} map is full at {_prefix(role, key)}",
                    "remove entries, or split the set",
                    EX_CONFIG,
                ) from None
            _grow(name, fds, 1)
        bpf_calls.map_update(fds[role], key, value)


def _grow(name: str, fds: Maps, more: int) -> None:
    """Give the set a hosts map with room for ``more`` whole addresses besides those it
    holds (twice the room at least, MOST_SIZE at most), while every program that
    names it runs.  Under the set's lock (a changing _opened: no entry is written
    meanwhile): the entries are copied into a larger map, pinned as GROWN, which one
    update of hosts_at then puts in force for every program at once, and which a
    rename then makes the hosts pin.  No packet is judged on a half-filled map: the
    old one serves, whole, until the switch.  A kill at any step leaves the set as it
    was or as it is after, never between (repair)."""
    at, old = fds[_FOLDER], fds["hosts"]
    room = bpf_calls.map_shape(old)[3]
    keys, values, held = bpf_calls.map_items(old, SET_HOST.size, SET_EXPIRY.size)
    wanted = held + more
    if wanted > MOST_SIZE:
        raise AlfError(
            f"set {name}",
            f"{wanted} whole addresses are more than a set holds ({MOST_SIZE})",
            "remove entries, or split the set",
            EX_CONFIG,
        )
    size = min(MOST_SIZE, max(2 * room, 1 << (wanted - 1).bit_length()))
    new = new_map(name, "hosts", size)
    switched = False
    try:
        for start in range(0, held, BATCH):
            count = min(BATCH, held - start)
            bpf_calls.map_update_batch(
                new,
                keys[start * SET_HOST.size : (start + count) * SET_HOST.size],
                values[start * SET_EXPIRY.size : (start + count) * SET_EXPIRY.size],
                count,
            )
        pin(new, at, GROWN)
        crash_point("set-grown-pinned")
        bpf_map_put_fd(fds["hosts_at"], 0, new)  # in force for every program from here
        switched = True
        crash_point("set-grown-switched")
        os.rename(GROWN, "hosts", src_dir_fd=at, dst_dir_fd=at)
    except OSError as err:
        _undo_growth(at, new, switched)
        raise fail(f"growing set {name}", err) from None
    except BaseException:
        _undo_growth(at, new, switched)
        raise
    os.close(old)
    fds["hosts"] = new


def _undo_growth(at: int, new: int, switched: bool) -> None:
    """A growth that failed: before the switch, its copy goes; after, repair finishes
    it at the next change (the slot holds the copy, which GROWN names)."""
    if not switched:
        with contextlib.suppress(OSError):
            os.unlink(GROWN, dir_fd=at)
    os.close(new)


def _sweep(fd: int, role: str) -> int:
    """Remove lapsed entries; how many."""
    size = (SET_HOST if role == "hosts" else SET_RANGE).size
    now, gone = now_ns(), 0
    for key in bpf_calls.map_keys(fd, size):
        found = bpf_calls.map_lookup(fd, key, SET_EXPIRY.size)
        if found is not None and 0 < _expiry(role, found) <= now:
            gone += bpf_calls.map_delete(fd, key)
    return gone


def sweep(name: str, roles: Sequence[str] = ("hosts", "ranges")) -> int:
    """Remove the set's lapsed entries (of these maps); how many.  Lapsed ranges are
    best gone soon: the kernel looks past at most ALF_SET_NEST nested ones.  A sweep
    of the hosts rebuilds the sieve without the bits of what it removed."""
    with _opened(name) as fds:
        try:
            gone = sum(_sweep(fds[role], role) for role in roles)
            if "hosts" in roles:
                resieve(fds)
            return gone
        except OSError as err:
            raise fail(f"sweeping set {name}", err) from None


def add(name: str, prefixes: Sequence[Prefix], timeout: float = 0.0) -> None:
    """Put prefixes in the set, each lapsing after ``timeout`` seconds (0: never); an
    entry already there takes the new expiry."""
    expiry = now_ns() + int(timeout * 1e9) if timeout else 0
    with _opened(name) as fds:
        try:
            put(name, fds, prefixes, expiry)
        except OSError as err:
            raise fail(f"adding to set {name}", err) from None


def load_bulk() -> None:
    """Load what hold and assign take many entries with (numpy): a daemon pays for it
    once, at its start, rather than in its first answer."""
    import numpy  # noqa: F401, PLC0415


Keyed = dict[str, tuple[list[bytes], list[bytes]]]  # role -> keys, values


def _keyed(entries: dict[Prefix, int], shift: int) -> tuple[Keyed, Sieved]:
    """Each entry's key and value (_key, _value), by map, and their bits in a sieve
    of this shift (sieved); whole addresses, nearly all of a CrowdSec answer, in numpy
    columns (_hosts, spots_of), picked out by them too; ranges one by one."""
    import numpy as np  # noqa: PLC0415

    by_role: Keyed = {"hosts": ([], []), "ranges": ([], [])}
    if not entries:
        return by_role, Sieved({}, 0)
    prefixes, count = list(entries), len(entries)
    families = np.fromiter(map(itemgetter(0), prefixes), dtype=np.uint8, count=count)
    lengths = np.fromiter(map(itemgetter(2), prefixes), dtype=np.uint8, count=count)
    values = np.fromiter(map(itemgetter(1), prefixes), dtype=object, count=count)
    untils = np.fromiter(entries.values(), dtype=np.uint64, count=count)
    whole = lengths == np.where(families == 4, 32, 128)
    ranges = [prefixes[at] for at in map(int, np.flatnonzero(~whole))]
    for prefix in ranges:
        by_role["ranges"][0].append(_key(prefix)[1])
        by_role["ranges"][1].append(_value(prefix, entries[prefix]))
    sieve_keys = []
    for family in (4, 6):
        picked = np.flatnonzero(whole & (families == family))
        if picked.size:
            keys, sieve_key = _hosts(family, values[picked])
            by_role["hosts"][0].extend(keys)  # and their values, SET_EXPIRY: native u64
            by_role["hosts"][1].extend(
                cast("list[bytes]", np.frombuffer(untils[picked].tobytes(), "V8").tolist())
            )
            sieve_keys.append(sieve_key)
    found = sieved(shift, ranges)
    if not sieve_keys:
        return by_role, found
    spots = spots_of(np.concatenate(sieve_keys), shift)
    for index, bits in found.spots.items():
        spots[index] = spots.get(index, 0) | bits
    return by_role, Sieved(spots, found.ranges)


def _hosts(family: int, values: Array) -> tuple[list[bytes], Array]:
    """Whole addresses' keys (_key) and their sieve's keys (sieved), many at once, from
    a column of the addresses (Python's ints): numpy's columns, not a loop of Python."""
    import numpy as np  # noqa: PLC0415

    # Its fields are written by name, which numpy 2's stubs refuse of a record they
    # cannot see (Debian 13's numpy is 2.2; 12's 1.24 refuses the dtype instead).
    key: Any = np.zeros(len(values), dtype=np.dtype(_host_record(family)))  # type: ignore[call-overload,unused-ignore]
    key["length"], key["family"] = FAMILY_BITS[family], family
    if family == 4:
        signed = values.astype(np.int64)  # past 63 bits: OverflowError
        if (signed >> 32).any():  # negative or past 32 bits: the record would cut it
            raise OverflowError("an IPv4 address out of 32 bits")
        key["addr"] = sieve_key = signed.astype(np.uint64)
    elif (values < 0).any():  # as _key: below, the halves would wrap
        raise OverflowError("a negative IPv6 address")
    else:  # sieved's key of an IPv6 address; the product wraps at 64 bits, as in C
        key["hi"] = high = (values >> 64).astype(np.uint64)
        key["lo"] = low = (values & M64).astype(np.uint64)
        sieve_key = high ^ low * np.uint64(SIEVE_MIX)
    return cast(
        "list[bytes]", np.frombuffer(key.tobytes(), f"V{SET_HOST.size}").tolist()
    ), sieve_key


def _bits_first(name: str, fds: Maps, entries: dict[Prefix, int]) -> tuple[Keyed, Sieved]:
    """The entries keyed (_keyed), their bits set in the sieve before they go in."""
    by_role, bits = _keyed(entries, shift_of(fds["sieve"]))
    try:
        sieve_add(fds["sieve"], bits)
    except OSError as err:
        raise fail(f"adding to set {name}", err) from None
    crash_point("set-bits-set")
    return by_role, bits


def hold(name: str, entries: dict[Prefix, int]) -> None:
    """Put each prefix in the set until its own expiry (monotonic ns; 0: never)."""
    with _opened(name) as fds:
        by_role, _ = _bits_first(name, fds, entries)
        _hold_keyed(name, fds, by_role)


def assign(name: str, entries: dict[Prefix, int]) -> int:
    """Make the set hold these entries and nothing else (a resync); how many of what
    it held were removed.  Under one lock: no change of another process falls between
    the removal and the holding."""
    with _opened(name) as fds:
        by_role, bits = _bits_first(name, fds, entries)
        removed = 0
        for role in ("hosts", "ranges"):
            wanted = set(by_role[role][0])
            size = (SET_HOST if role == "hosts" else SET_RANGE).size
            try:
                for key in [k for k in bpf_calls.map_keys(fds[role], size) if k not in wanted]:
                    removed += bpf_calls.map_delete(fds[role], key)
            except OSError as err:
                raise fail(f"removing from set {name}", err) from None
        _hold_keyed(name, fds, by_role)
        try:  # the set holds these alone now: their bits alone
            sieve_exact(fds["sieve"], bits, fds["hosts_at"])
        except OSError as err:
            raise fail(f"rebuilding the sieve of set {name}", err) from None
    return removed


class NotWhole(AlfError):
    """Entries the set could not take (it cannot grow: at MOST_SIZE, or no memory for a
    larger map); every other one was put in.  ``unstored``: how many."""

    def __init__(self, first: AlfError, unstored: int) -> None:
        super().__init__(
            first.what,
            f"{unstored} entries could not be stored: {first.why}",
            first.hint,
            first.exit_code,
        )
        self.unstored = unstored


def _hold_keyed(name: str, fds: Maps, by_role: Keyed) -> None:
    """Whole addresses in one batch update (Linux 5.6), shorter prefixes one by one
    (an LPM trie has no batch update); their sieve's bits are set already.  An entry
    the set cannot take stops no other: once the hosts map cannot grow, the rest go in
    one by one (those it holds are renewed, new ones counted), the ranges go in, and
    NotWhole then says how many were left out."""
    unstored, first = 0, None
    try:
        keys, values = by_role["hosts"]
        for start in range(0, len(keys), BATCH):
            part = slice(start, start + BATCH)
            if first is not None:
                unstored += _one_by_one(fds["hosts"], keys[part], values[part])
                continue
            batch = (b"".join(keys[part]), b"".join(values[part]), len(keys[part]))
            try:
                bpf_calls.map_update_batch(fds["hosts"], *batch)
            except OSError as err:
                if err.errno != errno.E2BIG:
                    raise
                _sweep(fds["hosts"], "hosts")
                try:
                    _grow(name, fds, batch[2])  # room for the whole batch, then it again
                except AlfError as grown:
                    # Only into the map programs read: a growth that failed after its
                    # switch leaves another in force until repair (the next change).
                    if hosts_in_force(fds["hosts_at"]) != bpf_calls.map_info_id(fds["hosts"]):
                        raise
                    first = grown
                    unstored += _one_by_one(fds["hosts"], keys[part], values[part])
                    continue
                bpf_calls.map_update_batch(fds["hosts"], *batch)
        for key, value in zip(*by_role["ranges"], strict=True):
            try:
                _update(name, fds, "ranges", key, value)
            except AlfError as full:
                first, unstored = first or full, unstored + 1
    except OSError as err:
        raise fail(f"adding to set {name}", err) from None
    if first is not None:
        raise NotWhole(first, unstored)


def _one_by_one(fd: int, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
    """Each entry on its own into a hosts map that cannot grow; how many found no room."""
    left = 0
    for key, value in zip(keys, values, strict=True):
        try:
            bpf_calls.map_update(fd, key, value)
        except OSError as err:
            if err.errno not in (errno.E2BIG, errno.ENOSPC, errno.ENOMEM):
                raise
            left += 1
    return left


def delete(name: str, prefixes: Sequence[Prefix]) -> int:
    """Take prefixes out of the set; how many were there.  Their bits stay in the
    sieve until as many removals as it has words call for a rebuild (resieve)."""
    with _opened(name) as fds:
        try:
            gone = sum(bpf_calls.map_delete(fds[r], k) for r, k in map(_key, prefixes))
            _count_stale(fds, gone)
            return gone
        except OSError as err:
            raise fail(f"removing from set {name}", err) from None


def count(name: str) -> int:
    """How many entries the set's maps hold, lapsed ones included (read in batches:
    what a bouncer reports after an answer it could not apply whole)."""
    with _opened(name, changing=False) as fds:
        try:
            held = bpf_calls.map_items(fds["hosts"], SET_HOST.size, SET_EXPIRY.size)[2]
            return held + len(bpf_calls.map_keys(fds["ranges"], SET_RANGE.size))
        except OSError as err:
            raise fail(f"counting set {name}", err) from None


def entries(name: str) -> list[tuple[Prefix, int]]:
    """The set's standing entries with their expiries (0: never); lapsed ones are
    removed on the way."""
    out = []
    with _opened(name) as fds:
        for role in ("hosts", "ranges"):
            fd = fds[role]
            gone = _sweep(fd, role)
            if role == "hosts":
                _count_stale(fds, gone)
            size = (SET_HOST if role == "hosts" else SET_RANGE).size
            for key in bpf_calls.map_keys(fd, size):
                found = bpf_calls.map_lookup(fd, key, SET_EXPIRY.size)
                if found is not None:
                    out.append((_prefix(role, key), _expiry(role, found)))
    return sorted(out, key=lambda e: (e[0].family, e[0].value, e[0].length))


def flush(name: str) -> int:
    """Empty the set; how many entries it held."""
    gone = 0
    with _opened(name) as fds:
        for role in ("hosts", "ranges"):
            size = (SET_HOST if role == "hosts" else SET_RANGE).size
            for key in bpf_calls.map_keys(fds[role], size):
                gone += bpf_calls.map_delete(fds[role], key)
        sieve_exact(fds["sieve"], Sieved({}, 0), fds["hosts_at"])  # nothing needs a bit
    return gone


def holding(name: str, family: int, value: int) -> tuple[Prefix, int] | None:
    """The standing entry of the set that holds an address (the address itself, else
    the longest range), with its expiry, for `explain`."""
    with _opened(name, changing=False) as fds:
        hosts, ranges = fds["hosts"], fds["ranges"]
        _, key = _key(Prefix(family, value, FAMILY_BITS[family]))
        found = [("hosts", hosts, key)]
        longest = _longest(ranges, family, value)
        if longest is not None:
            found.append(("ranges", ranges, longest))
        for role, fd, k in found:
            raw = bpf_calls.map_lookup(fd, k, SET_EXPIRY.size)
            expiry = None if raw is None else _expiry(role, raw)
            if expiry is not None and (expiry == 0 or expiry > now_ns()):
                return _prefix(role, k), expiry
    return None


def _longest(fd: int, family: int, value: int) -> bytes | None:
    """The key of the longest range holding an address (an LPM trie's lookup gives
    the value alone, so the keys are compared here: `explain` only)."""
    best: tuple[int, bytes] | None = None
    for key in bpf_calls.map_keys(fd, SET_RANGE.size):
        entry = _prefix("ranges", key)
        shift = FAMILY_BITS[family] - entry.length
        if entry.family == family and entry.value >> shift == value >> shift:
            if best is None or entry.length > best[0]:
                best = (entry.length, key)
    return None if best is None else best[1]


def resieve(fds: Maps) -> None:
    """Rebuild the sieve from what the hash and trie hold."""
    sieve = fds["sieve"]
    held = [_prefix("hosts", k) for k in bpf_calls.map_keys(fds["hosts"], SET_HOST.size)]
    ranges = [_prefix("ranges", k) for k in bpf_calls.map_keys(fds["ranges"], SET_RANGE.size)]
    sieve_exact(sieve, sieved(shift_of(sieve), held + ranges), fds["hosts_at"])


def _count_stale(fds: Maps, removed: int) -> None:
    """Count removals whose bits the sieve keeps; past as many as it has words, it is
    rebuilt (a CrowdSec set's decisions come and go for as long as the host runs)."""
    if not removed:
        return
    sieve = fds["sieve"]
    hosts, stale = sieve_header(sieve)
    if stale + removed > words_of(sieve):
        resieve(fds)
    else:
        set_header(sieve, hosts, stale + removed)
