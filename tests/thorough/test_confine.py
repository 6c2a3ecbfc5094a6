"""The loader's compile cannot read a file it was not meant to, however the source
names it: Landlock (loader.server.confine) is the guard, not the text check.

Each source is compiled as the loader compiles it, in a child of its own, and an
inotify watch on a secret file counts every open of it.  The control compiles the
same sources with nothing in the way, to show that each spelling does read the file
there: a spelling that reads nothing would prove nothing."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.support import ROOT

from alfwrapper import state

pytestmark = pytest.mark.thorough  # some ninety compiles: not in the fast tier

PROBE = ROOT / "tests/programs/confine_probe.py"
TOKEN = "ALFSECRET4711"
ENTRY = "\nint filter(struct __sk_buff *skb) { return 1; }\n"


def named(p: str) -> dict[str, str]:
    """The spellings that got past the text check once, and .incbin."""
    include = f'include "{p}"\n'
    return {
        "lone CR before #": f"\r#{include}",
        "backslash-space-newline in the word": f'#inc\\ \nlude "{p}"\n',
        "backslash-CR in the word": f'#inc\\\rlude "{p}"\n',
        "form feed after #": f"#\f{include}",
        "vertical tab after #": f"#\v{include}",
        "form feed before #": f"\f#{include}",
        ".incbin": f'asm(".incbin \\"{p}\\"");\n',
    }


def fuzzed(p: str, count: int, seed: int = 23) -> list[str]:
    """Seeded spellings: line splices, form feeds and tabs, digraphs, macros that
    expand to the path, stringizing, __has_include, _Pragma, include_next."""
    rng = random.Random(seed)
    leads = ["", "\r", "\f", "\v", " ", "\t", "\f\v", "/**/"]
    hashes = ["#", "%:"]
    gaps = ["", " ", "\f", "\v", "\\\n", "\\ \n", "\\\r", "\\\r\n", "/**/", "\\\n\f"]
    splices = ["\\\n", "\\ \n", "\\\r\n", "\\\t\n"]
    out = []
    for _ in range(count):
        word = rng.choice(["include", "include", "include_next", "import"])
        if rng.random() < 0.6:
            cut = rng.randrange(1, len(word))
            word = word[:cut] + rng.choice(splices) + word[cut:]
        target = rng.choice(["quoted", "angled", "macro", "stringized", "pasted"])
        pre = ""
        if target == "quoted":
            name = f'"{p}"'
        elif target == "angled":
            name = f"<{p}>"
        elif target == "macro":
            pre, name = f'#define F_ "{p}"\n', "F_"
        elif target == "stringized":
            pre, name = "#define S_(x) #x\n#define T_(x) S_(x)\n", f"T_({p})"
        else:
            pre, name = "#define D_(x) x\n", f'D_("{p}")'
        line = f"{rng.choice(leads)}{rng.choice(hashes)}{rng.choice(gaps)}{word} {name}\n"
        out.append(pre + line)
    out += [
        f'#if __has_include("{p}")\n#include "{p}"\n#endif\n',
        f'_Pragma("GCC dependency \\"{p}\\"")\n#include "{p}"\n',
        f'#define INC_ ".incbin \\"{p}\\""\nasm(INC_);\n',
        f'%:define Q_ "{p}"\n%:include Q_\n',
    ]
    return out


def probe(secret: Path, mode: str, sources: list[str]) -> list[dict[str, Any]]:
    texts = [f'#include "common.h"\n{s}{ENTRY}' for s in sources]
    out = subprocess.run(
        [sys.executable, str(PROBE), str(secret), mode],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(out.stdout)
    return results


@pytest.fixture
def secret(tmp_path: Path) -> Any:
    path = tmp_path / "secret"
    path.write_text(f"{TOKEN} must never be read\n")
    yield path
    shutil.rmtree(state.USERS_ROOT / "4000000", ignore_errors=True)


def sources(secret: Path) -> tuple[dict[str, str], list[str]]:
    spellings = named(str(secret))
    return spellings, list(spellings.values()) + fuzzed(str(secret), 40)


def test_the_spellings_read_the_file_when_nothing_is_in_the_way(
    bpf_root: None, secret: Path
) -> None:
    """The control: unconfined, every named spelling reads the file, and so do most of
    the fuzzed ones."""
    spellings, texts = sources(secret)
    control = probe(secret, "open", texts)
    for (name, _), got in zip(spellings.items(), control, strict=False):
        assert got["opened"], f"{name!r} does not read the file even unconfined: {got['said']}"
    assert sum(1 for got in control if got["opened"]) > len(texts) // 2


def test_no_spelling_reads_a_file_in_the_loaders_compile(bpf_root: None, secret: Path) -> None:
    """Confined with the text check off, nothing reads the file and nothing shows it.
    (With the check on, as the loader runs, a source is either refused before any
    compile or compiled exactly as here: this run covers both.)"""
    _, texts = sources(secret)
    for source, got in zip(texts, probe(secret, "confined", texts), strict=True):
        assert not got["opened"] and not got["shown"], (source, got["said"])
