"""Table cache entries as files (alfwrapper/bpf/table_cache.py, host/cachedir.Entry):
what is recorded comes back as it went; an entry over its bound, a damaged one or one
under another name is not used; a store whose file vanished is no error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alfwrapper.bpf import table_cache
from alfwrapper.host import cachedir

pytestmark = pytest.mark.unit

NAME = "table-" + "ab" * 32


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ALFWRAPPER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def record(name: str = NAME) -> table_cache.Recorder:
    kept = table_cache.Recorder(name)
    kept.write("subnet_v4", 4096, b"\1" * 64)
    kept.write("subnet_v6", 0, memoryview(bytes(range(256)) * 4))
    kept.batch("subnet_roots", 2, b"\0\0\0\0\1\0\0\0", b"\7\0\0\0\5\0\0\0")
    return kept


def test_what_is_recorded_comes_back(folder: Path) -> None:
    assert not folder.exists()  # nothing is made before the first write
    record().keep((("V4_ROOT_BITS", "24"),))
    image = table_cache.load(NAME)
    assert image is not None and image.defines == (("V4_ROOT_BITS", "24"),)
    assert [(m, o, bytes(d)) for m, o, d in image.writes] == [
        ("subnet_v4", 4096, b"\1" * 64),
        ("subnet_v6", 0, bytes(range(256)) * 4),
    ]
    ((name, count, keys, values),) = image.batches
    assert (name, count, bytes(keys), bytes(values)) == (
        "subnet_roots",
        2,
        b"\0\0\0\0\1\0\0\0",
        b"\7\0\0\0\5\0\0\0",
    )
    assert table_cache.load("table-" + "cd" * 32) is None


@pytest.mark.parametrize("where", [0, 100, -5, -1])
def test_a_damaged_entry_is_a_miss(folder: Path, where: int) -> None:
    record().keep(())
    entry = folder / NAME
    data = bytearray(entry.read_bytes())
    data[where] ^= 0x40
    entry.write_bytes(bytes(data))
    assert table_cache.load(NAME) is None


def test_an_entry_under_another_name_is_a_miss(folder: Path) -> None:
    record().keep(())
    other = "table-" + "ef" * 32
    (folder / NAME).rename(folder / other)
    assert table_cache.load(other) is None


def test_a_table_over_the_bound_is_not_kept(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_cache, "MAX_ENTRY_BYTES", 1000)
    record().keep(())
    assert not folder.exists() or not list(folder.iterdir()), "kept, or left behind"
    assert table_cache.load(NAME) is None


def test_a_store_whose_file_vanished_is_no_error(folder: Path) -> None:
    entry = cachedir.Entry(str(folder))
    entry.write(b"x" * 100)
    os.unlink(entry.temporary)  # a gc took it for a crashed store's leftover
    os.rmdir(folder)
    assert entry.commit("somewhere") is False
