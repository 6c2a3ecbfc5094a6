"""The man page and README stay in step with the command line."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support import ROOT

from alfwrapper.cli import check_parser, explain_parser, wrapper_parser
from alfwrapper.policy import KEYS


def long_options() -> set[str]:
    return {
        o
        for parser in (wrapper_parser(), check_parser(), explain_parser())
        for action in parser._actions
        for o in action.option_strings
        if o.startswith("--") and o != "--help"
    }


@pytest.mark.parametrize(
    "page", ["man/alfwrapper.1", "man/alfwrapper.policy.5", "man/alfwrapper-loader.8"]
)
def test_man_page_lints_clean(page: str) -> None:
    if shutil.which("mandoc") is None:
        pytest.fail("mandoc is missing: `make setup` installs it")
    out = subprocess.run(
        ["mandoc", "-Tlint", "-W", "warning", str(ROOT / page)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("doc", ["man/alfwrapper.1", "README.md"])
def test_every_option_is_documented(doc: str) -> None:
    text = (ROOT / doc).read_text().replace("\\-", "-").replace("Fl -", "--")
    missing = {o for o in long_options() if not re.search(re.escape(o) + r"\b", text)}
    assert not missing, f"{doc} does not mention {sorted(missing)}"


def test_exit_codes_are_documented() -> None:
    man = (ROOT / "man/alfwrapper.1").read_text()
    readme = (ROOT / "README.md").read_text()
    for code in (64, 65, 66, 69, 70, 71, 77, 78):
        assert f".It {code}" in man
    for code in (64, 65, 66, 69, 70, 71, 77, 78):
        assert f"| {code} |" in readme


def test_every_policy_key_is_documented() -> None:
    page = (ROOT / "man/alfwrapper.policy.5").read_text()
    documented = {
        word.strip(",")
        for line in page.splitlines()
        if line.startswith(".It Cm ")
        for word in line[len(".It Cm ") :].split()
    }
    assert set(KEYS) | {"address", "name"} <= documented, sorted(set(KEYS) - documented)
