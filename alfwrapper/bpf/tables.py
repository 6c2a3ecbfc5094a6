"""A loaded program's maps by name, read and written through bpf(2): no BCC.

A program compiled here (compiler.py) and one taken from the program cache
(cache.py) both hand their maps over as ``Tables``; filling, counters, the
watcher and `check` use only this.  Each map is described by a ``MapSpec``:
its kernel shape and the C types of its key and value as BCC describes them
(JSON), from which the ctypes classes that --set and the knock part fill are
made (``map_values.ctype_of``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

from alfwrapper.bpf import map_values
from alfwrapper.host import bpf_calls
from alfwrapper.record import Record

_PER_CPU = (5, 6, 10)  # BPF_MAP_TYPE_PERCPU_HASH, _PERCPU_ARRAY, _LRU_PERCPU_HASH


class MapSpec(Record):
    """What it takes to make a map again: its kernel shape and its C types."""

    name: str
    kind: int
    key_size: int
    value_size: int
    entries: int
    flags: int
    key_desc: Any  # BCC's JSON description of the key type ("" for none)
    leaf_desc: Any


@functools.cache
def possible_cpus() -> int:
    """How many CPUs a per-CPU map keeps a value for: the CPUs in the kernel's
    cpu_possible_mask, counted (its copy to user space packs them: "0,2" is two)."""
    with open("/sys/devices/system/cpu/possible", encoding="ascii") as f:
        text = f.read().strip()  # no guess without it: too few slots would overrun a buffer
    count = 0
    for span in text.split(","):
        first, _, last = span.partition("-")
        count += int(last or first) - int(first) + 1
    return count


class Table:
    """One map: its fd, and its key and value as ctypes (``Key``, ``Leaf``)."""

    def __init__(self, spec: MapSpec, fd: int) -> None:
        self.spec = spec
        self.map_fd = fd

    @functools.cached_property
    def Key(self) -> Any:  # named as BCC's tables name it
        return map_values.ctype_of(self.spec.key_desc)

    @functools.cached_property
    def Leaf(self) -> Any:
        return map_values.ctype_of(self.spec.leaf_desc)

    def __getitem__(self, key: Any) -> Any:
        raw = bpf_calls.map_lookup(self.map_fd, bytes(key), self.spec.value_size)
        if raw is None:
            raise KeyError(key)
        return self.Leaf.from_buffer_copy(raw)

    def __setitem__(self, key: Any, value: Any) -> None:
        bpf_calls.map_update(self.map_fd, bytes(key), bytes(value))

    def __delitem__(self, key: Any) -> None:
        bpf_calls.map_delete(self.map_fd, bytes(key))

    def keys(self) -> list[Any]:
        return [
            self.Key.from_buffer_copy(k)
            for k in bpf_calls.map_keys(self.map_fd, self.spec.key_size)
        ]

    def per_cpu(self, key: Any) -> list[int]:
        """A per-CPU map's unsigned integer values for ``key``, one per possible CPU."""
        stride = (self.spec.value_size + 7) & ~7
        raw = bpf_calls.map_lookup(self.map_fd, bytes(key), stride * possible_cpus())
        if raw is None:
            return []
        return [
            int.from_bytes(raw[i : i + self.spec.value_size], "little")
            for i in range(0, len(raw), stride)
        ]

    def items_update_batch(self, keys: Any, values: Any) -> None:
        bpf_calls.map_update_batch(self.map_fd, bytes(keys), bytes(values), len(keys))


class OwnFds:
    """Fds closed when the last reference goes, as BCC's module closes its own;
    ``keep``: what else must live as long (the BCC module whose maps these are)."""

    def __init__(self, keep: Any = None) -> None:
        self.fds: list[int] = []
        self.keep = keep

    def __del__(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass


class Tables:
    """A program's maps by name (bytes or str), as BCC's module offered them.

    ``owner``: what keeps the fds open while this is referenced (and the BCC
    module of a program compiled here, as ``owner.keep``)."""

    def __init__(self, tables: dict[str, Table], owner: OwnFds) -> None:
        self._tables = tables
        self.owner = owner

    def __getitem__(self, name: bytes | str) -> Table:
        return self._tables[name.decode() if isinstance(name, bytes) else name]

    def __contains__(self, name: bytes | str) -> bool:
        return (name.decode() if isinstance(name, bytes) else name) in self._tables

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def fds(self) -> dict[str, int]:
        return {name: table.map_fd for name, table in self._tables.items()}

    def specs(self) -> list[MapSpec]:
        return [table.spec for table in self._tables.values()]
