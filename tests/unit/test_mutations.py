"""Every mutation of `make mutate` (tests/mutate.py) still matches the code it breaks:
its text occurs exactly once in its file, so a mutation never goes stale unseen (only a
full root `make mutate` would notice otherwise) and never breaks the wrong place."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _mutations() -> list:  # type: ignore[type-arg]
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "tests" / "mutate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return list(module.MUTATIONS)


def test_every_mutation_text_occurs_once_in_its_file() -> None:
    stale = []
    names = set()
    for m in _mutations():
        assert m.name not in names, f"two mutations named {m.name}"
        names.add(m.name)
        text = (ROOT / m.path).read_text()
        for old, _new in ((m.old, m.new), *m.also):
            if text.count(old) != 1:
                stale.append(f"{m.name}: {text.count(old)} times in {m.path}: {old[:60]!r}")
        for test in m.tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).exists(), f"{m.name}: no {test}"
            function = name.split("[")[0]
            if function and f"def {function}(" not in (ROOT / path).read_text():
                stale.append(f"{m.name}: no {function} in {path}")
    assert not stale, "\n".join(stale)
