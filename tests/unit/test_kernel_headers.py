"""Where BCC's kernel headers are found (kernel_headers.py), on made-up file systems:
Debian's split trees under /usr/src, a tree of the kernel's own under /lib/modules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alfwrapper.host import kernel_headers

pytestmark = pytest.mark.unit


def debian_headers(root: Path, version: str, flavour: str = "amd64") -> Path:
    """A Debian split tree: linux-headers-VERSION-FLAVOUR (generated files, a Makefile
    naming the common tree) beside linux-headers-VERSION-common."""
    arch = root / f"usr/src/linux-headers-{version}-{flavour}"
    common = root / f"usr/src/linux-headers-{version}-common"
    (common / "include/linux").mkdir(parents=True)
    (common / kernel_headers.KCONFIG).write_text("/* kconfig */\n")
    (arch / "include/generated").mkdir(parents=True)
    (arch / "include/generated/autoconf.h").write_text("/* autoconf */\n")
    (arch / "Makefile").write_text(f"include /usr/src/linux-headers-{version}-common/Makefile\n")
    return arch


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernel_headers.SOURCE_VARIABLE, raising=False)


def test_the_running_kernels_own_debian_headers(tmp_path: Path) -> None:
    arch = debian_headers(tmp_path, "6.1.0-56")
    debian_headers(tmp_path, "6.1.0-99")  # newer, but not this kernel's
    tree = kernel_headers.find("6.1.0-56-amd64", tmp_path)
    assert tree is not None and tree.release == "6.1.0-56-amd64"
    assert tree.source == tmp_path / "usr/src/linux-headers-6.1.0-56-common"
    assert arch / "include" in tree.include
    assert any(str(p).endswith("include/generated/uapi") for p in tree.include)


def test_a_kernel_without_headers_gets_the_newest_debian_ones(tmp_path: Path) -> None:
    for version in ("6.1.0-9", "6.1.0-56", "6.1.0-10"):
        debian_headers(tmp_path, version)
    tree = kernel_headers.find("6.18.44-custom", tmp_path)
    assert tree is not None and tree.release == "6.1.0-56-amd64", tree
    assert tree.source == tmp_path / "usr/src/linux-headers-6.1.0-56-common"


def test_a_tree_under_lib_modules_is_left_to_bcc(tmp_path: Path) -> None:
    debian_headers(tmp_path, "6.1.0-56")
    own = tmp_path / "lib/modules/6.18.1/build"
    (own / "include/linux").mkdir(parents=True)
    (own / kernel_headers.KCONFIG).write_text("")
    tree = kernel_headers.find("6.18.1", tmp_path)
    assert tree is not None and tree.source is None and tree.where == str(own)
    with kernel_headers.for_bcc(tree) as include:
        assert include == [] and kernel_headers.SOURCE_VARIABLE not in os.environ


def test_incomplete_trees_are_not_headers(tmp_path: Path) -> None:
    arch = debian_headers(tmp_path, "6.1.0-56")
    (arch / "include/generated/autoconf.h").unlink()  # the generated half is missing
    assert kernel_headers.find("6.1.0-56-amd64", tmp_path) is None
    (arch / "include/generated/autoconf.h").write_text("")
    (arch / "Makefile").write_text("include /etc/passwd\n")  # names no common tree
    assert kernel_headers.find("6.1.0-56-amd64", tmp_path) is None


def test_bcc_is_pointed_at_the_tree_only_while_it_compiles(tmp_path: Path) -> None:
    debian_headers(tmp_path, "6.1.0-56")
    tree = kernel_headers.find("6.1.0-56-amd64", tmp_path)
    with kernel_headers.for_bcc(tree) as include:
        assert os.environ[kernel_headers.SOURCE_VARIABLE] == str(tree.source if tree else "")
        assert include and all(flag.startswith("-I") for flag in include)
    assert kernel_headers.SOURCE_VARIABLE not in os.environ  # the application never sees it


def test_an_override_is_bccs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernel_headers.SOURCE_VARIABLE, "/somewhere")
    tree = kernel_headers.find("6.1.0-56-amd64", tmp_path)
    assert tree is not None and tree.source is None and "/somewhere" in tree.where
