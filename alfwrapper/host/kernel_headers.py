"""Where BCC finds kernel headers, from inside the shipped units' sandbox.

BCC looks for headers at /lib/modules/RELEASE/build only, and the units'
ProtectKernelModules=yes makes /usr/lib/modules inaccessible.  Debian's headers
live in /usr/src (linux-headers-RELEASE, the generated files, beside the
-common tree it names in its Makefile), which the sandbox leaves readable: BCC
compiles from the -common tree (BCC_KERNEL_SOURCE) with the generated
directories added to its include path, the way BCC itself does for a split
tree it finds under /lib/modules.  Nothing is written anywhere.

A kernel without a headers package of its own (a cloud or custom kernel) gets
the newest Debian headers: a socket filter uses only the UAPI and basic types.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alfwrapper.record import Record

SOURCE_VARIABLE = "BCC_KERNEL_SOURCE"
KCONFIG = "include/linux/kconfig.h"  # what BCC checks for (loader.cc)
_DEBIAN = "usr/src"
_MODULES = "lib/modules"
_MAKEFILE_INCLUDE = re.compile(r"^include\s+/(usr/src/linux-headers-[^/\s]+)/Makefile\s*$", re.M)


class HeaderTree(Record):
    """Kernel headers BCC can compile against.

    ``source`` is what BCC_KERNEL_SOURCE must name (None: BCC finds them by
    itself), ``include`` the generated directories to add with -I, and
    ``where`` what to tell a user."""

    where: str
    release: str
    source: Path | None = None
    include: tuple[Path, ...] = ()

    @property
    def exact(self) -> bool:
        return self.release == os.uname().release


def _arch() -> str:
    """The kernel's name for this architecture, as in arch/NAME/include."""
    machine = os.uname().machine
    return {"x86_64": "x86", "i686": "x86", "aarch64": "arm64"}.get(machine, machine)


def _readable(path: Path) -> bool:
    try:
        return path.is_file() and os.access(path, os.R_OK)
    except OSError:  # an inaccessible parent (ProtectKernelModules=)
        return False


def debian_tree(arch_dir: Path, root: Path = Path("/")) -> HeaderTree | None:
    """Debian's split headers: ``arch_dir`` (linux-headers-RELEASE) holds the generated
    files and names its -common tree in its Makefile (a path under ``root``)."""
    try:
        makefile = (arch_dir / "Makefile").read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return None
    match = _MAKEFILE_INCLUDE.search(makefile)
    if not match:
        return None
    common = root / match.group(1)
    if not (_readable(common / KCONFIG) and _readable(arch_dir / "include/generated/autoconf.h")):
        return None
    generated = arch_dir / "arch" / _arch() / "include/generated"
    return HeaderTree(
        where=f"{arch_dir} (with {common})",
        release=arch_dir.name.removeprefix("linux-headers-"),
        source=common,
        include=(
            generated,
            arch_dir / "include",
            generated / "uapi",
            arch_dir / "include/generated/uapi",
        ),
    )


def _version_key(path: Path) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def find(release: str | None = None, root: Path = Path("/")) -> HeaderTree | None:
    """The headers BCC will use for ``release`` (default: the running kernel), or None.
    ``root``: where the file system starts (tests)."""
    release = release or os.uname().release
    if os.environ.get(SOURCE_VARIABLE):
        return HeaderTree(f"{os.environ[SOURCE_VARIABLE]} ({SOURCE_VARIABLE})", release)
    modules = root / _MODULES / release
    for sub in ("source", "build"):  # BCC's own lookup; a real tree of the kernel's own
        if _readable(modules / sub / KCONFIG):
            return HeaderTree(str(modules / sub), release)
    debian = root / _DEBIAN
    exact = debian_tree(debian / f"linux-headers-{release}", root)
    if exact:
        return exact
    others = sorted(debian.glob("linux-headers-*"), key=_version_key, reverse=True)
    for arch_dir in others:
        tree = debian_tree(arch_dir, root)
        if tree:
            return tree
    kheaders = root / "sys/kernel/kheaders.tar.xz"
    if kheaders.exists():  # CONFIG_IKHEADERS: BCC unpacks it
        return HeaderTree(str(kheaders), release)
    return None


HINT = "apt-get install linux-headers-amd64 (BCC compiles against them)"


def searched(release: str | None = None) -> str:
    """Where find() looks, for a message."""
    release = release or os.uname().release
    return f"looked in /{_MODULES}/{release}/build and /{_DEBIAN}/linux-headers-*"


@contextmanager
def for_bcc(tree: HeaderTree | None) -> Iterator[list[str]]:
    """While BCC compiles: BCC_KERNEL_SOURCE set for ``tree`` (and unset after, so that
    the application never inherits it), and the -I flags to add to its cflags."""
    if tree is None or tree.source is None:
        yield []
        return
    os.environ[SOURCE_VARIABLE] = str(tree.source)
    try:
        yield [f"-I{path}" for path in tree.include]
    finally:
        os.environ.pop(SOURCE_VARIABLE, None)
