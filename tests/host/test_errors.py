"""Every bad input: one line on stderr, a sysexits code, and COMMAND never runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import NO_CAPS, ROOT, WRAPPER
from helpers.wrapping import assert_one_line, run

from alfwrapper.bpf.parts import Subnets
from alfwrapper.bpf.subnet_table import SMALL_RULES
from alfwrapper.errors import EX_COMPILER_ENDED

pytestmark = pytest.mark.host


@pytest.mark.parametrize(
    ("options", "code", "needles"),
    [
        (["--allow", "300.1.2.3/8"], 64, ["--allow", "300.1.2.3/8"]),
        (["--deny", "192.0.2.5/24"], 64, ["--deny", "did you mean 192.0.2.0/24"]),
        (["--allow-file", "/nonexistent/rules"], 66, ["/nonexistent/rules", "no such file"]),
        (["--listen", "localhost:80"], 64, ["--listen", "not an IP address"]),
        (["--name", "web", "--listen", "8080"], 64, ["--name", "follows no --listen"]),
        (["--listen", "8080", "--name", "a:b"], 64, ["not a valid socket name"]),
        (["--bogus"], 64, ["usage", "--bogus"]),
        ([], 64, ["sockets", "none inherited"]),
        (
            ["--listen", "8080", "--knock-secret", "/nonexistent/secret"],
            66,
            ["knock secret /nonexistent/secret", "no such file"],
        ),
        (
            ["--listen", "8080", "--filter", "/nonexistent/f.c"],
            66,
            ["--filter /nonexistent/f.c", "no such file"],
        ),
    ],
)
def test_bad_input(tmp_path: Path, options: list[str], code: int, needles: list[str]) -> None:
    returncode, stderr, ran = run(tmp_path, *options)
    assert (returncode, ran) == (code, False), stderr
    assert_one_line(stderr, *needles)


def test_bad_line_in_rule_file(tmp_path: Path) -> None:
    rules = tmp_path / "deny.rules"
    rules.write_text("# ok\n192.0.2.0/24\n198.51.100.0/24\n203.0.113.0/33\n")
    returncode, stderr, ran = run(tmp_path, "--listen", "8080", "--deny-file", str(rules))
    assert (returncode, ran) == (65, False)
    assert_one_line(stderr, f"{rules}:4", "longer than 32")


def test_foreign_listen_pid(tmp_path: Path) -> None:
    returncode, stderr, ran = run(
        tmp_path, "--allow", "192.0.2.0/24", env={"LISTEN_FDS": "1", "LISTEN_PID": "1"}
    )
    assert (returncode, ran) == (78, False)
    assert_one_line(stderr, "LISTEN_PID=1 is not this process")


def test_listen_fds_that_are_not_sockets(tmp_path: Path) -> None:
    # The wrapper's own pid is only known once it runs: let a shell exec it.
    code = (
        f"LISTEN_PID=$$ LISTEN_FDS=1 exec {' '.join(WRAPPER)} --allow 192.0.2.0/24 "
        f"-- /bin/sh -c 'touch {tmp_path}/command-ran' 3</dev/null"
    )
    out = subprocess.run(["/bin/sh", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 78
    assert not (tmp_path / "command-ran").exists()
    assert_one_line(out.stderr, "inherited fd 3", "is not a socket")


def test_command_not_found(tmp_path: Path) -> None:
    out = subprocess.run(
        [*WRAPPER, "--listen", "8080", "--", "/nonexistent/app"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 66
    assert_one_line(out.stderr, "/nonexistent/app", "not found")


def test_no_command(tmp_path: Path) -> None:
    out = subprocess.run([*WRAPPER, "--listen", "8080"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 64
    assert_one_line(out.stderr, "no COMMAND")


def test_socket_that_cannot_be_bound(bpf_root: None, tmp_path: Path) -> None:
    # 192.0.2.99 is on no interface of this host.
    returncode, stderr, ran = run(tmp_path, "--listen", "192.0.2.99:8080")
    assert (returncode, ran) == (71, False), stderr
    assert_one_line(stderr, "binding tcp 192.0.2.99:8080", "not configured on this host")


def test_port_in_use(bpf_root: None, tmp_path: Path) -> None:
    returncode, stderr, ran = run(
        tmp_path, "--listen", "127.0.0.1:8099", "--listen", "127.0.0.1:8099"
    )
    assert (returncode, ran) == (71, False), stderr
    assert_one_line(stderr, "binding tcp 127.0.0.1:8099", "Address already in use")


def test_missing_privilege(bpf_root: None, tmp_path: Path) -> None:
    # Root without any capability, while kernel.unprivileged_bpf_disabled != 0.
    unpriv = Path("/proc/sys/kernel/unprivileged_bpf_disabled").read_text().strip()
    assert unpriv != "0", "this test needs unprivileged BPF to be disabled (the default)"
    returncode, stderr, ran = run(
        tmp_path,
        "--listen",
        "127.0.0.1:8098",
        "--deny",
        "203.0.113.0/24",
        prefix=NO_CAPS,
    )
    # Without CAP_BPF the filters would come from the loader, which does not run
    # here: the one line says which unit to start.
    assert (returncode, ran) == (69, False), stderr
    assert_one_line(stderr, "the loader does not answer", "alfwrapper-loader.socket", "CAP_BPF")


def test_spa_without_cap_bpf_is_refused(bpf_root: None, tmp_path: Path) -> None:
    """Without CAP_BPF filters come from the loader, which makes no SPA socket's program:
    said before anything is asked of it (exit 64), not left to fail later."""
    secret = tmp_path / "spa.secret"
    secret.write_text("a secret of thirty-two bytes, or so\n")
    returncode, stderr, ran = run(
        tmp_path,
        "--listen",
        "127.0.0.1:8093",
        "--knock-secret",
        str(secret),
        "--knock-spa",
        prefix=NO_CAPS,
    )
    assert (returncode, ran) == (64, False), stderr
    assert_one_line(stderr, "knock-spa (unknown.spa)", "the loader", "CAP_BPF")


def test_verbose_adds_details_but_no_traceback(bpf_root: None, tmp_path: Path) -> None:
    path = ROOT / "tests/data/broken.c"
    quiet = run(tmp_path, "--listen", "127.0.0.1:8097", "--filter", str(path))
    returncode, stderr, ran = run(
        tmp_path, "-v", "--listen", "127.0.0.1:8097", "--filter", str(path)
    )
    assert (returncode, ran) == (quiet[0], False) == (65, False)
    assert stderr.startswith(quiet[1].rstrip("\n")) and len(stderr) > len(quiet[1])
    assert "error:" in stderr.split("\n", 1)[1]  # the compiler's own output follows
    assert "Traceback" not in stderr


def test_compile_error_names_file_and_line(bpf_root: None, tmp_path: Path) -> None:
    path = ROOT / "tests/data/broken.c"
    returncode, stderr, ran = run(tmp_path, "--listen", "127.0.0.1:8096", "--filter", str(path))
    assert (returncode, ran) == (65, False)
    assert_one_line(stderr, f"{path}:4:", "undeclared identifier 'undefined_thing'")


def test_verifier_rejection_says_why(bpf_root: None, tmp_path: Path) -> None:
    path = ROOT / "tests/data/unsafe.c"
    returncode, stderr, ran = run(tmp_path, "--listen", "127.0.0.1:8096", "--filter", str(path))
    assert (returncode, ran) == (65, False)
    assert_one_line(
        stderr,
        "verifier rejected",
        "invalid unbounded variable-offset read",
        "near unsafe.c:6: return buf[i];",
    )
    returncode, stderr, ran = run(
        tmp_path, "-v", "--listen", "127.0.0.1:8096", "--filter", str(path)
    )
    assert "processed" in stderr  # -v: the whole verifier log


def test_a_filter_the_verifier_gives_up_on_is_said_to_be_rejected(
    bpf_root: None, tmp_path: Path
) -> None:
    """The kernel refuses a program the verifier gave up on (a million instructions
    processed) with E2BIG, the errno of a program with too many maps: it is said as
    the verifier's rejection, with the verifier's own words, not as too many maps."""
    path = ROOT / "tests/data/too_large.c"
    returncode, stderr, ran = run(tmp_path, "--listen", "127.0.0.1:8096", "--filter", str(path))
    assert (returncode, ran) == (65, False)
    assert_one_line(stderr, "verifier rejected", "BPF program is too large")
    assert "maps" not in stderr


def test_a_filter_llvm_ends_the_process_for_is_said_in_one_line(
    bpf_root: None, tmp_path: Path
) -> None:
    """LLVM ends the process on a filter whose stack passes 512 bytes (exit(1), no
    error back to BCC): the application never starts, the exit status is LLVM's 1,
    and a witness says why in one line (what LLVM said, where to put the bytes)."""
    path = ROOT / "tests/data/big_stack.c"
    returncode, stderr, ran = run(tmp_path, "--listen", "127.0.0.1:8096", "--filter", str(path))
    assert (returncode, ran) == (EX_COMPILER_ENDED, False)
    assert_one_line(
        stderr, f"compiling the filter {path}", "BPF stack limit of 512 bytes", "per-CPU array map"
    )


def test_check_print_filter_compiles_what_it_prints(bpf_root: None, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *WRAPPER,
            "check",
            "--allow",
            "192.0.2.0/24",
            "--deny",
            "192.0.2.128/25",
            "--print-filter",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    # One block split by the /25: a 16-bit first level and one leaf of 8 KiB.
    assert "#define V4_ROOT_BITS 16\n#define V4_LEAVES 1\n#define V4_LEAF_BYTES 8192" in out.stdout
    assert "#define SUBNET_NODES 1\n" in out.stdout
    assert f"if (!({Subnets.condition}))" in out.stdout  # the subnet part's own test
    assert "sets_verdict" not in out.stdout  # no named set, no sets part
    assert "knock_pass" not in out.stdout.split("alfwrapper-composed.c")[-1]
    # What it prints is compiled: a filter that does not compile fails the check.
    broken = ROOT / "tests/data/broken.c"
    out = subprocess.run(
        [*WRAPPER, "check", "--filter", str(broken), "--print-filter"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 65
    assert_one_line(out.stderr, f"{broken}:4:", "undeclared identifier")
    # The wrapper itself points there.
    returncode, stderr, ran = run(tmp_path, "--allow", "192.0.2.0/24", "--print-filter")
    assert (returncode, ran) == (64, False)
    assert_one_line(stderr, "alfwrapper check --print-filter")


def test_module_and_script_entry_points() -> None:
    for argv in (WRAPPER, [str(Path(sys.executable).parent / "alfwrapper")]):
        out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0
        assert out.stdout.startswith("alfwrapper ")


# -- input that is too much, too slow, or not a file --------------------------


@pytest.mark.parametrize("option", ["--allow-file", "--knock-secret", "--filter"])
def test_fifo_without_writer_is_refused_at_once(tmp_path: Path, option: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    returncode, stderr, ran = run(tmp_path, "--listen", "8080", option, str(fifo))
    assert (returncode, ran) == (66, False), stderr
    assert_one_line(stderr, str(fifo), "not a regular file (it is a FIFO)")


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "character device"), ("/tmp", "directory")]
)
def test_device_or_directory_as_rule_file(tmp_path: Path, path: str, kind: str) -> None:
    returncode, stderr, ran = run(tmp_path, "--listen", "8080", "--deny-file", path)
    assert (returncode, ran) == (66, False), stderr
    assert_one_line(stderr, f"rule file {path}", f"not a regular file (it is a {kind})")


def test_rule_file_over_the_size_limit(tmp_path: Path) -> None:
    from alfwrapper.policy.inputs import RULE_FILE_LIMIT  # noqa: PLC0415

    big = tmp_path / "big.rules"
    with big.open("wb") as f:
        f.truncate(RULE_FILE_LIMIT + 1)  # sparse: nothing is written, nothing need be read
    returncode, stderr, ran = run(tmp_path, "--listen", "8080", "--allow-file", str(big))
    assert (returncode, ran) == (65, False), stderr
    assert_one_line(stderr, str(big), f"larger than {RULE_FILE_LIMIT} bytes")


def test_huge_bad_line_is_quoted_short(tmp_path: Path) -> None:
    rules = tmp_path / "long.rules"
    rules.write_text("192.0.2.0/24\n" + "x" * 1_000_000 + "\n")
    returncode, stderr, ran = run(tmp_path, "--listen", "8080", "--allow-file", str(rules))
    assert (returncode, ran) == (65, False)
    assert_one_line(stderr, f"{rules}:2", "'xxxx")
    assert len(stderr) < 400, len(stderr)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--knock-open-for", "1e-12"], "--knock-open-for: 1e-12 s is shorter than a round trip"),
        (["--knock-timeout", "0.01"], "--knock-timeout: 0.01 s is shorter than a round trip"),
        (["--knock-open-for", "nan"], "--knock-open-for: out of range"),
    ],
)
def test_knock_settings_that_cannot_work(tmp_path: Path, options: list[str], needle: str) -> None:
    returncode, stderr, ran = run(tmp_path, "--listen", "8080", "--knock", "7001,7002", *options)
    assert (returncode, ran) == (64, False), stderr
    assert_one_line(stderr, needle)


def test_listen_fds_out_of_range(tmp_path: Path) -> None:
    code = (
        f"LISTEN_PID=$$ LISTEN_FDS=99999999999999999999 exec {' '.join(WRAPPER)} "
        f"--allow 192.0.2.0/24 -- /bin/sh -c 'touch {tmp_path}/command-ran'"
    )
    out = subprocess.run(["/bin/sh", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 78, out.stderr
    assert not (tmp_path / "command-ran").exists()
    assert_one_line(out.stderr, "LISTEN_FDS=99999999999999999999", "more fds than this process")


def exec_with_socket(tmp_path: Path, make: str, name: str, *options: str, command: str) -> str:
    """Make a socket with the Python statement ``make`` (as s), pass it as fd 3, run the
    wrapper on it; returns the result as "code|stderr"."""
    script = (
        "import os, socket, sys\n"
        f"{make}\n"
        "os.dup2(s.fileno(), 3)\nos.set_inheritable(3, True)\n"
        f"os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES={name!r})\n"
        f"os.execvp(sys.executable, [sys.executable, '-m', 'alfwrapper', *{list(options)!r}, "
        f"'--', '/bin/sh', '-c', {command!r}])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    return f"{out.returncode}|{out.stdout}|{out.stderr}"


def test_inherited_tcp_socket_neither_listening_nor_connected(tmp_path: Path) -> None:
    result = exec_with_socket(
        tmp_path,
        "s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)",
        "web",
        "--allow",
        "192.0.2.0/24",
        command=f"touch {tmp_path}/command-ran",
    )
    code, _, stderr = result.split("|", 2)
    assert code == "78", result
    assert not (tmp_path / "command-ran").exists()
    assert_one_line(stderr, "inherited fd 3 (web)", "neither listening nor connected")


def test_socket_with_a_reserved_looking_name_is_still_filtered(
    bpf_root: None, tmp_path: Path
) -> None:
    # Names once set aside for the wrapper's own stored fds: a socket is a socket.
    result = exec_with_socket(
        tmp_path,
        "s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.bind(('::1', 0)); s.listen()",
        "alfwrapper-next-1",
        "--allow",
        "192.0.2.0/24",
        command="echo $LISTEN_FDS $LISTEN_FDNAMES",
    )
    code, stdout, stderr = result.split("|", 2)
    assert (code, stdout.strip()) == ("0", "1 alfwrapper-next-1"), result
    assert "no rules" not in stderr


def test_command_that_cannot_be_executed(bpf_root: None, tmp_path: Path) -> None:
    # Found and executable, but no valid program: exec fails after the filters are in.
    bogus = tmp_path / "bogus"
    bogus.write_bytes(b"\x7fELF not really\n")
    bogus.chmod(0o755)
    out = subprocess.run(
        [*WRAPPER, "--listen", "127.0.0.1:8095", "--deny", "203.0.113.0/24", "--", str(bogus)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 66, out.stderr
    # The filters were in force, and said so, before exec itself failed: that line,
    # then the error's one line.
    said, error = out.stderr.split("\n", 1)
    assert said.startswith("alfwrapper: filters in force for bogus after "), out.stderr
    assert_one_line(error, f"starting {bogus}", "Exec format error")


# Runs alfwrapper's CLI with one library made unimportable, as on a --no-deps install.
WITHOUT = """import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == sys.argv[1]:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
from alfwrapper.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


MANY_RULES = [w for i in range(SMALL_RULES + 1) for w in ("--allow", f"198.51.100.{i}/32")]


@pytest.mark.parametrize("where", ["command line", "rule file"])
def test_a_few_rules_start_without_numpy(bpf_root: None, tmp_path: Path, where: str) -> None:
    """Up to SMALL_RULES rules given on the command line or in a rule file of at most
    SMALL_RULES lines, a start needs no numpy: the command runs behind them (docs/install.md,
    Requirements)."""
    mark = tmp_path / "command-ran"
    rules = MANY_RULES[: 2 * SMALL_RULES]
    if where == "rule file":
        lines = ["# a few", *rules[1 : 2 * SMALL_RULES - 4 : 2], "2001:db8::/64  # six"]
        (tmp_path / "few").write_text("\n".join(lines) + "\n")
        assert len(lines) == SMALL_RULES  # at most SMALL_RULES lines: the edge
        rules = ["--allow-file", str(tmp_path / "few")]
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT, "numpy", "--listen", "127.0.0.1:8098", *rules,
         "--", "/bin/sh", "-c", f"touch {mark}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0 and mark.exists(), out.stderr


@pytest.mark.parametrize(
    ("library", "package", "argv", "env"),
    [
        # (gc needs no pyroute2: host/sockdiag.py)
        ("pyroute2", "python3-pyroute2", ["--listen", "127.0.0.1:8098", "--interface", "lo"], {}),
        # numpy lays out more than SMALL_RULES rules (subnet_table.py); fewer need none
        ("numpy", "python3-numpy", ["--listen", "127.0.0.1:8098", *MANY_RULES], {}),
        ("bcc", "python3-bpfcc", ["--listen", "127.0.0.1:8098", "--allow", "192.0.2.0/24"], {}),
        ("systemd", "python3-systemd", ["--allow", "192.0.2.0/24"], {"LISTEN_FDS": "1"}),
        (
            "setproctitle",
            "python3-setproctitle",
            ["--listen", "127.0.0.1:8098", "--interface", "lo"],
            {},
        ),
    ],
)
def test_a_missing_library_is_one_line_and_names_its_package(
    bpf_root: None,
    tmp_path: Path,
    library: str,
    package: str,
    argv: list[str],
    env: dict[str, str],
) -> None:
    mark = tmp_path / "command-ran"
    argv = [*argv, "--", "/bin/sh", "-c", f"touch {mark}"]
    script = 'exec "$@"'
    if env:  # the sockets are this shell's, which becomes the wrapper (LISTEN_PID)
        script = 'LISTEN_PID=$$ exec "$@" 3</dev/null'
    out = subprocess.run(
        ["sh", "-c", script, "sh", sys.executable, "-c", WITHOUT, library, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    assert out.returncode == 69 and not mark.exists(), out.stderr
    assert_one_line(out.stderr, f"Python module {library}", f"apt-get install {package}")
    # doctor says the same, for every library it needs.
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT, library, "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 69, out.stdout + out.stderr
    problems = [line for line in out.stdout.splitlines() if line.startswith("problem:")]
    assert len(problems) == 1 and f"apt-get install {package}" in problems[0], out.stdout


FILTER_WITH_MAP = """#include "common.h"
BPF_HASH(keep, u32, u8, 4);
{decl}
int filter(struct __sk_buff *skb) {{ return ALF_PASS; }}
"""


@pytest.mark.parametrize(
    ("decl", "needles"),
    [
        # A name in a reserved prefix: refused before compiling, at its line.
        (
            "BPF_HASH(subnet_x, u32, u8, 4);",
            [":3:", "'subnet_x'", "reserved", "subnet_, iface_, knock_, alf_"],
        ),
        ('BPF_F_TABLE("array", u32, u64, alf_mine, 4, 0);', [":3:", "'alf_mine'", "reserved"]),
        # The name of a built-in map: which one it clashes with.
        ("BPF_ARRAY(subnet_roots, u32, 4);", [":3:", "'subnet_roots'", "alfwrapper's own map"]),
    ],
)
def test_reserved_map_names_are_refused(
    bpf_root: None, tmp_path: Path, decl: str, needles: list[str]
) -> None:
    path = tmp_path / "mine.c"
    path.write_text(FILTER_WITH_MAP.format(decl=decl))
    returncode, stderr, ran = run(tmp_path, "--listen", "127.0.0.1:8095", "--filter", str(path))
    assert (returncode, ran) == (65, False), stderr
    assert_one_line(stderr, str(path), *needles)


def test_set_on_a_map_the_filter_lacks_names_its_maps(bpf_root: None, tmp_path: Path) -> None:
    path = tmp_path / "mine.c"
    path.write_text(FILTER_WITH_MAP.format(decl="BPF_ARRAY(limits, u32, 4);"))
    returncode, stderr, ran = run(
        tmp_path, "--listen", "127.0.0.1:8095", "--filter", str(path), "--set", "subnet_x", "1", "1"
    )
    assert (returncode, ran) == (64, False), stderr
    assert_one_line(stderr, "--set subnet_x", "has no map 'subnet_x'", "its maps: keep, limits")


def test_a_map_hidden_behind_a_macro_still_names_the_clash(bpf_root: None, tmp_path: Path) -> None:
    """A reserved name the declaration check cannot see (through a macro) meets the
    built-in map at compile time: the one line names the map, not BCC's typedef."""
    path = tmp_path / "mine.c"
    path.write_text(
        FILTER_WITH_MAP.format(decl="#define MINE subnet_roots\nBPF_ARRAY(MINE, u32, 4);")
    )
    returncode, stderr, ran = run(
        tmp_path, "--listen", "127.0.0.1:8095", "--allow", "192.0.2.0/24", "--filter", str(path)
    )
    assert (returncode, ran) == (65, False), stderr
    assert_one_line(stderr, "two maps are named 'subnet_roots'", "subnet_, iface_, knock_, alf_")


def test_a_huge_line_in_a_rule_file_costs_little_memory(tmp_path: Path) -> None:
    """A rule file of one 50 MB line (under the 64 MiB file limit) is refused with its line
    number, in a small multiple of the file's size (not the gigabytes a bulk parse of
    it would take)."""
    path = tmp_path / "huge.rules"
    path.write_bytes(b"192.0.2.0/24\n" + b"1" * (50 << 20) + b"\n")
    measure = (
        "import resource, subprocess, sys\n"
        "out = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(out.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(out.stderr, end='')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", measure, *WRAPPER, "check", "--allow-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    code, peak_kib = map(int, out.stdout.split("\n", 1)[0].split())
    assert code == 65, out.stdout
    assert f"{path}:2: the line '1111" in out.stdout, out.stdout
    assert "is longer than 4096 bytes" in out.stdout, out.stdout
    assert peak_kib < 200 * 1024, f"{peak_kib} KiB"
