"""Every subcommand's --help exits 0 with examples, and bash completion comes from the
same argparse definitions, working in a real bash."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import ROOT

from alfwrapper.cli import main as cli

pytestmark = pytest.mark.unit

NAMES = ["", *cli.SUBCOMMANDS]  # "": the wrapper itself


@pytest.mark.parametrize("name", NAMES)
def test_help_exits_0_with_examples(name: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        cli.main([name, "--help"] if name else ["--help"])
    assert done.value.code == 0, out.getvalue()
    text = out.getvalue()
    assert text.startswith("usage: alfwrapper"), text
    examples = text.split("examples:", 1)
    assert len(examples) == 2, f"alfwrapper {name} --help shows no examples:\n{text}"
    assert f"alfwrapper {name}".strip() in examples[1], examples[1]


@pytest.mark.parametrize("argv", [[], ["help"]])
def test_a_bare_alfwrapper_and_help_list_the_commands(argv: list[str]) -> None:
    """`alfwrapper` and `alfwrapper help` list every subcommand, a line each, exit 0;
    `alfwrapper help NAME` is NAME --help; an unknown name is a usage error."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    block = out.getvalue().split("subcommands:\n", 1)[1].split("\n\n", 1)[0]
    listed = [line.split()[0] for line in block.splitlines()]
    assert listed == list(cli.SUBCOMMANDS), out.getvalue()
    assert all(len(line) <= 80 for line in out.getvalue().splitlines()), out.getvalue()
    with contextlib.redirect_stdout(io.StringIO()) as one, pytest.raises(SystemExit) as done:
        cli.main(["help", "status"])
    assert done.value.code == 0 and one.getvalue().startswith("usage: alfwrapper status")
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["help", "nope"]) == 64


@pytest.mark.parametrize("name", NAMES)
def test_every_option_has_help(name: str) -> None:
    parser = cli.parser_of(name)
    bare = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
    assert not bare, f"alfwrapper {name}: options without help text: {bare}"


def completion(tmp_script: str, words: str) -> list[str]:
    """What bash completes for the command line ``words`` (the last word is partial)."""
    script = (
        f"source {tmp_script}\n"
        f"COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
        'COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}\n'
        "fn=$(complete -p alfwrapper | sed -E 's/.* -F ([^ ]+) .*/\\1/')\n"
        '$fn alfwrapper "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(
        ["bash", "--norc", "-c", script], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_bash_completion_is_generated_and_works(tmp_path: Path) -> None:
    """As `make completion` makes it (python -m alfwrapper.completion), written here,
    not into the checkout."""
    if shutil.which("bash") is None:
        pytest.fail("bash is missing")
    out = subprocess.run(
        [sys.executable, "-m", "alfwrapper.completion"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    script = tmp_path / "alfwrapper"
    script.write_text(out.stdout)
    registered = subprocess.run(
        ["bash", "--norc", "-c", f"source {script} && complete -p alfwrapper"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert registered.returncode == 0 and "alfwrapper" in registered.stdout, registered.stderr
    assert {"status", "stop"} & set(completion(str(script), "alfwrapper st")) == {"status"}
    assert "--allow-file" in completion(str(script), "alfwrapper --allow-f")
    assert "--sequence" in completion(str(script), "alfwrapper knock 192.0.2.1 8080 --seq")
    assert "--prometheus" in completion(str(script), "alfwrapper status --prom")
    # Choices past the first (Debian's shtab 1.5.5 alone offers only the first).
    assert completion(str(script), "alfwrapper explain --protocol u") == ["udp"]
    assert set(completion(str(script), "alfwrapper lo")) == {"log", "loader"}
