"""The man pages and the guides in docs/ stay in step with the command line."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from helpers.support import ROOT

from alfwrapper import errors
from alfwrapper.cli.policy import check_parser, explain_parser
from alfwrapper.cli.wrapper import wrapper_parser
from alfwrapper.policy.files import KEYS

pytestmark = pytest.mark.unit


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


def guides() -> str:
    return "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


@pytest.mark.parametrize("doc", ["man/alfwrapper.1", "docs"])
def test_every_option_is_documented(doc: str) -> None:
    text = guides() if doc == "docs" else (ROOT / doc).read_text()
    text = text.replace("\\-", "-").replace("Fl -", "--")
    missing = {o for o in long_options() if not re.search(re.escape(o) + r"\b", text)}
    assert not missing, f"{doc} does not mention {sorted(missing)}"


def test_exit_codes_are_documented() -> None:
    """The man page's EXIT STATUS and docs/operating.md's table list the same codes:
    every code errors.py defines, and no other."""
    man = (ROOT / "man/alfwrapper.1").read_text()
    readme = (ROOT / "docs/operating.md").read_text()
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
    """docs/daemons.md's lighttpd command logs into examples/lighttpd: git ignores those."""
    for log in ("access.log", "error.log"):
        ignored = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "-q", f"examples/lighttpd/{log}"]
        )
        assert ignored.returncode == 0, log


def test_architecture_layout_names_every_package_and_module() -> None:
    """docs/architecture.md's Layout shows each package of alfwrapper and each module."""
    text = (ROOT / "docs/architecture.md").read_text()
    layout = text.split("## Layout", 1)[1].split("```", 2)[1]
    missing = []
    for path in sorted((ROOT / "alfwrapper").rglob("*.py")):
        rel = path.relative_to(ROOT / "alfwrapper")
        if path.name in ("__init__.py", "__main__.py"):
            if path.name == "__init__.py" and rel.parent != rel.parent.parent:
                missing += [] if f"{rel.parent}/" in layout else [f"{rel.parent}/"]
            continue
        missing += [] if re.search(rf"\b{path.stem}\b", layout) else [str(rel)]
    assert not missing, f"docs/architecture.md's Layout does not name {missing}"


def test_the_readme_is_short_and_names_the_packages_dependencies() -> None:
    """The README is for someone with the package: at most 300 lines, and its Install
    names every package debian/control depends on (first alternatives)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    control = (ROOT / "debian/control").read_text().split("Package: alfwrapper", 1)[1]
    depends = control.split("\nDepends:", 1)[1].split("\nRecommends:", 1)[0]
    names = {d.split("|")[0].strip() for d in depends.split(",")} - {""}
    names = {n for n in names if not n.startswith("$")}
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert names and not {n for n in names if f"`{n}`" not in install}, names


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def test_every_link_of_the_readme_and_the_guides_is_there() -> None:
    """Each fact in one place, linked from the others: every relative link of the
    README and docs/ names a file that exists, and a heading in it."""
    broken = []
    for doc in [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *sorted((ROOT / "docs").glob("*.md")),
    ]:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path) if path else doc
            if not file.exists() or (
                anchor and file.suffix == ".md" and anchor not in anchors(file.read_text())
            ):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_guide_opens_with_an_example() -> None:
    """A guide by task starts from something a reader can paste: a code block within
    its first lines (those that run on the package alone are run as written in the
    boot tier: test_units.test_the_guides_opening_examples_as_written)."""
    for guide in ("daemons", "rules", "knocking", "sets", "without-root", "operating"):
        head = (ROOT / "docs" / f"{guide}.md").read_text().splitlines()[:25]
        assert any(line.startswith("```") for line in head), guide
