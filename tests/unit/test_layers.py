"""The package boundary (tests/layers.py, also run by `make lint`)."""

from __future__ import annotations

from pathlib import Path

import layers
import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent.parent


def test_alfwrapper_imports_only_downward_and_in_no_circle() -> None:
    assert layers.breaches(ROOT / "alfwrapper") == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "alfwrapper"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_an_import_from_a_higher_layer_is_a_breach(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "host/__init__.py": "", "host/faults.py": "from alfwrapper.lifecycle import wrapper\n",
        "lifecycle/__init__.py": "", "lifecycle/wrapper.py": "from alfwrapper.host import faults\n",
    })  # fmt: skip
    found = layers.breaches(root)
    assert any("faults.py: imports alfwrapper.lifecycle.wrapper, a layer above" in f for f in found)
    assert any(f.startswith("circle: ") for f in found), found


def test_a_lazy_circle_inside_one_layer_is_a_breach(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "policy/__init__.py": "",
            "policy/rules.py": "def f():\n    from alfwrapper.policy import inputs\n",
            "policy/inputs.py": "from alfwrapper.policy.rules import f\n",
        },
    )
    assert [f for f in layers.breaches(root) if f.startswith("circle: ")], "circle not found"


def test_a_module_outside_every_layer_is_named(tmp_path: Path) -> None:
    root = _package(tmp_path, {"misc.py": ""})
    assert any("in no layer" in f for f in layers.breaches(root))
