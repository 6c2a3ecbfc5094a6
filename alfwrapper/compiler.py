"""Build filter programs: pick the template, compile it with BCC, load it, fill its maps.

The source and cflags are a pure function of the rules (``subnet_source``), so
the same rules always give the same program; loading is where the kernel and
its privileges come in (``load_subnet_filter``).
"""

from __future__ import annotations

import ctypes
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alfwrapper.errors import EX_DATAERR, EX_NOPERM, EX_OSERR, EX_SOFTWARE, AlfError
from alfwrapper.subnet_table import ROOT_ENTRIES, SubnetTable, encode_nodes

FILTER_DIR = Path(__file__).resolve().parent / "filters"
ENTRY = "filter"


@dataclass(frozen=True)
class FilterSource:
    """A filter's C file and the -D macros it is compiled with."""

    path: Path
    defines: tuple[tuple[str, str], ...]

    @property
    def cflags(self) -> list[str]:
        return [f"-I{FILTER_DIR}"] + [f"-D{name}={value}" for name, value in self.defines]


@dataclass
class LoadedFilter:
    """A loaded program; keep it referenced until its fd is attached."""

    bpf: Any
    fd: int


def subnet_source(table: SubnetTable) -> FilterSource:
    def steps(levels: tuple[int, ...]) -> str:
        return " ".join(f"SUBNET_STEP({n})" for n in levels)

    return FilterSource(
        path=FILTER_DIR / "subnets.c",
        defines=(
            ("SUBNET_NODES", str(max(1, len(table.nodes)))),
            ("V4_STEPS", steps(table.levels[4])),
            ("V6_STEPS", steps(table.levels[6])),
        ),
    )


def render(source: FilterSource) -> str:
    """The final C, as BCC compiles it: macros first, local includes inlined."""
    lines = [f"/* alfwrapper: {source.path.name}, compiled by BCC with these macros */"]
    lines += [f"#define {name} {value}" for name, value in source.defines]

    def inline(path: Path) -> list[str]:
        out = []
        for line in path.read_text().splitlines():
            match = re.match(r'#include "([^"]+)"', line)
            if match:
                out += inline(path.parent / match.group(1))
            else:
                out.append(line)
        return out

    return "\n".join(lines + inline(source.path)) + "\n"


@contextmanager
def _stderr_to(sink: list[str]) -> Iterator[None]:
    """Capture fd 2 while libbcc runs: clang and the verifier write there directly."""
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))


_PERMISSION = ("Operation not permitted", "EPERM")
_NEED_CAP = (
    "loading filters needs CAP_BPF while kernel.unprivileged_bpf_disabled is set: run as root "
    "with its capabilities, or give the service AmbientCapabilities=CAP_BPF"
)


def _permission_error(what: str, details: str) -> AlfError:
    return AlfError(what, "permission denied", _NEED_CAP, EX_NOPERM, details=details)


def _import_bcc() -> Any:
    try:
        import bcc  # noqa: PLC0415  (slow import, only when loading)
    except ImportError:
        raise AlfError(
            "BCC",
            "its Python bindings are not importable",
            "install python3-bpfcc and run alfwrapper with /usr/bin/python3 or `make run`",
            EX_SOFTWARE,
        ) from None
    return bcc


def _first_error(log: str, path: Path) -> str:
    """The compiler's first error as FILE:LINE:COL: message (BCC calls the file main.c)."""
    for line in log.splitlines():
        if "error:" in line:
            return re.sub(r"^/virtual/main\.c", str(path), line.strip())
    return ""


def _verifier_reason(log: str) -> str:
    """The verifier's own complaint: the last log line that is not its statistics."""
    for raw in reversed(log.splitlines()):
        line = raw.strip()
        if line and not line.startswith(("processed ", "verification time", "stack depth")):
            return line
    return "no verifier log"


def compile_and_load(source: FilterSource) -> LoadedFilter:
    """Compile with BCC and load the entry function as a socket filter."""
    bcc = _import_bcc()
    log: list[str] = []
    try:
        with _stderr_to(log):
            bpf = bcc.BPF(src_file=str(source.path).encode(), cflags=source.cflags)
    except Exception as err:  # BCC raises bare Exception
        text = "".join(log)
        if "Unable to find kernel headers" in text or "kernel headers" in text.lower():
            raise AlfError(
                f"compiling {source.path.name}",
                "BCC found no kernel headers",
                "run `alfwrapper doctor`, or `make setup` to lay out Debian's headers",
                EX_SOFTWARE,
                details=text,
            ) from None
        if any(p in text for p in _PERMISSION):
            raise _permission_error(f"creating the maps of {source.path.name}", text) from None
        text = text.replace("/virtual/main.c", str(source.path))
        first = _first_error(text, source.path) or str(err)
        raise AlfError(
            f"compiling {source.path.name}",
            first,
            "run with -v for the compiler output",
            EX_DATAERR,
            details=text,
        ) from None
    try:
        with _stderr_to(log):
            fn = bpf.load_func(ENTRY.encode(), bcc.BPF.SOCKET_FILTER)
    except Exception as err:
        text = "".join(log)
        message = str(err)
        if any(p in message for p in _PERMISSION):
            raise _permission_error(f"loading {source.path.name}", text) from None
        if "Permission denied" in message:
            raise AlfError(
                f"loading {source.path.name}",
                f"the verifier rejected the program: {_verifier_reason(text)}",
                "run with -v for the verifier log",
                EX_DATAERR,
                details=text,
            ) from None
        raise AlfError(
            f"loading {source.path.name}",
            message,
            "run with -v for details",
            EX_OSERR,
            details=text,
        ) from None
    return LoadedFilter(bpf=bpf, fd=fn.fd)


def _update_batch(table: Any, keys: bytes, values: bytes, count: int, name: str) -> None:
    """Fill a map in one BPF_MAP_UPDATE_BATCH call (Linux 5.6) from packed arrays."""
    key_array = (table.Key * count).from_buffer_copy(keys)
    value_array = (table.Leaf * count).from_buffer_copy(values)
    try:
        table.items_update_batch(key_array, value_array)
    except Exception as err:
        raise AlfError(
            f"filling map {name}",
            str(err),
            "check `alfwrapper doctor`; kernels before 5.6 lack batch updates",
            EX_OSERR,
        ) from None


def load_subnet_filter(table: SubnetTable) -> LoadedFilter:
    """Compile, load and fill the subnet filter for this table."""
    loaded = compile_and_load(subnet_source(table))
    roots = (ctypes.c_uint32 * ROOT_ENTRIES)(*table.roots)
    indexes = (ctypes.c_uint32 * ROOT_ENTRIES)(*range(ROOT_ENTRIES))
    _update_batch(
        loaded.bpf[b"subnet_roots"], bytes(indexes), bytes(roots), ROOT_ENTRIES, "subnet_roots"
    )
    if table.nodes:
        keys, values = encode_nodes(table)
        _update_batch(loaded.bpf[b"subnet_nodes"], keys, values, len(table.nodes), "subnet_nodes")
    return loaded
