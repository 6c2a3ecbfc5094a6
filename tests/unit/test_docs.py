"""The man page and README stay in step with the command line."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support import ROOT

from alfwrapper import errors
from alfwrapper.cli import check_parser, explain_parser, wrapper_parser
from alfwrapper.policy.files import KEYS


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
    """The man page's EXIT STATUS and the README's table list the same codes: every
    code errors.py defines, and no other."""
    man = (ROOT / "man/alfwrapper.1").read_text()
    readme = (ROOT / "README.md").read_text()
    defined = {v for k, v in vars(errors).items() if k.startswith("EX_") and v}
    assert set(map(int, re.findall(r"^\.It (\d+)$", man, re.M))) == defined
    assert set(map(int, re.findall(r"^\| (\d+) \|", readme, re.M))) == defined


def test_every_policy_key_is_documented() -> None:
    page = (ROOT / "man/alfwrapper.policy.5").read_text()
    documented = {
        word.strip(",")
        for line in page.splitlines()
        if line.startswith(".It Cm ")
        for word in line[len(".It Cm ") :].split()
    }
    assert set(KEYS) | {"address", "name"} <= documented, sorted(set(KEYS) - documented)


def test_see_also_names_the_systemd_pages_the_text_leans_on() -> None:
    see_also = (ROOT / "man/alfwrapper.1").read_text().split(".Sh SEE ALSO", 1)[1]
    for page in ("systemd.resource-control 5", "systemd.socket 5", "alfwrapper.policy 5"):
        assert f".Xr {page}" in see_also, page


def test_the_lighttpd_example_leaves_no_untracked_logs() -> None:
    """The README's lighttpd command logs into examples/lighttpd: git ignores those."""
    for log in ("access.log", "error.log"):
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q",
                                  f"examples/lighttpd/{log}"])  # fmt: skip
        assert ignored.returncode == 0, log


def test_readme_layout_names_every_package_and_module() -> None:
    """README's Layout shows each package of alfwrapper and each module in it."""
    text = (ROOT / "README.md").read_text()
    layout = text.split("## Layout", 1)[1].split("```", 2)[1]
    missing = []
    for path in sorted((ROOT / "alfwrapper").rglob("*.py")):
        rel = path.relative_to(ROOT / "alfwrapper")
        if path.name in ("__init__.py", "__main__.py"):
            if path.name == "__init__.py" and rel.parent != rel.parent.parent:
                missing += [] if f"{rel.parent}/" in layout else [f"{rel.parent}/"]
            continue
        missing += [] if re.search(rf"\b{path.stem}\b", layout) else [str(rel)]
    assert not missing, f"README's Layout does not name {missing}"
