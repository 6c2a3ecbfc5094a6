"""Policy files with real traffic: a file and its command line give the same verdicts;
bad files never start the service; `check` and `explain` say what the wrapper would do,
and `explain` agrees with real connections."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.hosts import CLIENT, Host, Network, Service, ip, link_hosts
from helpers.support import ECHO_SERVER, ROOT, WRAPPER
from helpers.wrapping import assert_one_line, knock, run

pytestmark = pytest.mark.netns

SOCKETS_TOML = (
    '[[listen]]\naddress = "[::]:8080"\nname = "web"\n'
    '[[listen-datagram]]\naddress = "[::]:8081"\nname = "dns"\n'
)
SOCKETS_ARGV = "--listen [::]:8080 --name web --listen-datagram [::]:8081 --name dns"
SECRET = "correct horse battery staple, but longer\n"


def probe_all(network: Network) -> list[str]:
    """What each of a fixed set of probes gets: echo, or nothing."""
    a, b = network.allowed, network.denied
    probes = [(h, p, f) for h in (a, b) for p in ("tcp", "udp") for f in (4, 6)]

    def one(probe: tuple[Host, str, int]) -> str:
        host, proto, family = probe
        return host.probe(proto, family, 8080 if proto == "tcp" else 8081, "x", 1.5)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, probes))


def knock_then_probe(network: Network) -> list[str]:
    a = network.allowed
    before = probe_all(network)
    knock(a, 4, "--sequence", "7001,7002,7003")
    after = [a.probe("tcp", 4, 8080, "in", 5.0)]
    time.sleep(2.5)  # longer than knock-open-for
    return [*before, *after, a.probe("tcp", 4, 8080, "late", 1.5)]


def secret_knock_then_probe(network: Network, secret: Path) -> list[str]:
    a = network.allowed
    before = probe_all(network)
    knock(a, 6, "--secret", str(secret), "--window", "10", "--steps", "4")
    return [*before, a.probe("tcp", 6, 8080, "in", 5.0)]


# name: (policy file text, the same as a command line, what to do with traffic).  Together
# they use every key.  {a} and {d} are filled in: the allowed host's link, the folder.
SCENARIOS: dict[str, tuple[str, str, Callable[..., list[str]]]] = {
    "subnets": (
        'allow = ["192.0.2.0/24", "2001:db8:a::/48"]\ndeny = ["2001:db8:a::2"]\n'
        'allow-file = ["more.txt"]\ndeny-file = ["less.txt"]\n'
        '[socket.dns]\nallow = ["198.51.100.0/24"]\n',
        "--allow 192.0.2.0/24 --allow 2001:db8:a::/48 --deny 2001:db8:a::2 "
        "--allow-file {d}/more.txt --deny-file {d}/less.txt --allow dns=198.51.100.0/24",
        lambda network, d: probe_all(network),
    ),
    "interface": (
        'interface = ["{a}"]\n',
        "--interface {a}",
        lambda network, d: probe_all(network),
    ),
    "knock": (
        "knock = [7001, 7002, 7003]\nknock-timeout = 2\nknock-open-for = 2\nknock-sources = 4096\n",
        "--knock 7001,7002,7003 --knock-timeout 2 --knock-open-for 2 --knock-sources 4096",
        lambda network, d: knock_then_probe(network),
    ),
    "knock-secret": (
        'knock-secret = "knock.secret"\nknock-window = 10\nknock-steps = 4\n',
        "--knock-secret {d}/knock.secret --knock-window 10 --knock-steps 4",
        lambda network, d: secret_knock_then_probe(network, d / "knock.secret"),
    ),
    "filter": (
        f'filter = "{ROOT}/tests/data/allowlist.c"\n'
        'set = [["allowed4", "192.0.2.2", "1"], ["allowed6", "2001:db8:a::2", "1"], '
        '["port_limits", "0", "8080,1"]]\n',
        f"--filter {ROOT}/tests/data/allowlist.c --set allowed4 192.0.2.2 1 "
        "--set allowed6 2001:db8:a::2 1 --set port_limits 0 8080,1",
        lambda network, d: probe_all(network),
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_file_and_command_line_give_the_same_verdicts(
    network: Network, services: list[Service], tmp_path: Path, scenario: str
) -> None:
    text, argv, traffic = SCENARIOS[scenario]
    (tmp_path / "more.txt").write_text("# more\n198.51.100.0/25\n")
    (tmp_path / "less.txt").write_text("198.51.100.2\n")
    (tmp_path / "knock.secret").write_text(SECRET)
    fill = {"a": network.allowed.server_if, "d": tmp_path}
    policy = tmp_path / "policy.toml"
    policy.write_text(text.format(**fill) + SOCKETS_TOML)  # keys before any [table]
    results = []
    for turn, options in enumerate(
        (["--policy", str(policy)], [*SOCKETS_ARGV.split(), *argv.format(**fill).split()])
    ):
        # A service of its own each: the knock state of one (a secret window that has
        # opened the door once) would be the other's, pinned in the service's folder.
        service = ["--service", f"same-{scenario}-{turn}"]
        svc = Service(network.server, [*WRAPPER, *service, *options, "--", *ECHO_SERVER])
        services.append(svc)
        svc.wait_for(r"^ready ")
        results.append(traffic(network, tmp_path))
        svc.stop()
    by_file, by_argv = results
    assert by_file == by_argv, (by_file, by_argv)
    assert "echo" in by_file and "timeout" in by_file, by_file  # the rules did something


BAD_POLICIES = [
    ("syntax", "allow = [\n", [], 78, ["policy.toml:", "TOML"]),
    ("unknown key", 'allow = ["192.0.2.0/24"]\nallw = []\n', [], 78, ["policy.toml:2", "'allw'"]),
    ("wrong type", "deny = 5\n", [], 78, ["policy.toml:1", "must be a list"]),
    ("missing file", 'allow-file = ["nosuch.txt"]\n', [], 66, ["nosuch.txt", "no such file"]),
    ("scope no socket has", '[socket.admn]\nallow = ["192.0.2.0/24"]\n', [], 78,
     ["policy.toml:1", "rules for admn", "no socket has that name"]),
    ("drop-in breaks vendor", 'allow = ["192.0.2.0/24"]\n', ["knock-steps = 0\n"], 78,
     ["policy.toml.d/10-admin.toml:1", "out of range"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "text", "dropins", "code", "needles"), BAD_POLICIES)
def test_bad_policy_never_starts_the_service(
    tmp_path: Path, case: str, text: str, dropins: list[str], code: int, needles: list[str]
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    if dropins:
        (tmp_path / "policy.toml.d").mkdir()
        (tmp_path / "policy.toml.d" / "10-admin.toml").write_text(dropins[0])
    returncode, stderr, ran = run(tmp_path, "--listen", "127.0.0.1:8094", "--policy", str(policy))
    assert (returncode, ran) == (code, False), stderr
    assert_one_line(stderr, *needles)


def run_cli(*argv: str, host: Host | None = None) -> subprocess.CompletedProcess[str]:
    command = [*WRAPPER, *argv]
    return subprocess.run(
        host.command(command) if host else command, capture_output=True, text=True, timeout=120
    )


def test_check_rejects_what_the_wrapper_rejects(bpf_root: None, tmp_path: Path) -> None:
    broken = ROOT / "tests/data/broken.c"
    for options, code, needle in (
        (["--interface", "nosuch0"], 78, "--interface nosuch0: no such interface"),
        (["--filter", str(broken)], 65, f"{broken}:4:"),
        (["--deny-file", str(tmp_path / "nosuch")], 66, "no such file"),
        (["--knock", "7001,7001"], 64, "follows itself"),
    ):
        checked = run_cli("check", "--listen", "127.0.0.1:8093", *options)
        returncode, stderr, ran = run(tmp_path, "--listen", "127.0.0.1:8093", *options)
        assert (checked.returncode, returncode, ran) == (code, code, False), checked.stderr
        assert_one_line(checked.stderr, needle)
        assert checked.stderr == stderr  # the same line, word for word


def test_check_summary_and_warnings(bpf_root: None, tmp_path: Path) -> None:
    policy = tmp_path / "web.toml"
    policy.write_text(
        'allow = ["192.0.2.0/24", "2001:db8::/32", "198.51.100.0/25"]\n'
        'deny = ["192.0.2.0/24", "198.51.100.0/24"]\n'
        "knock = [7001, 7002]\nknock-window = 10\n"
        '[[listen]]\naddress = "0.0.0.0:8080"\nname = "web"\n'
        '[socket.admn]\nallow = ["203.0.113.0/24"]\n'
    )
    out = run_cli("check", "--policy", str(policy))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("socket web (tcp 0.0.0.0:8080): 3 allow, 2 deny, knocking")
    assert "instructions" in lines[0] and "MiB" in lines[0]
    warnings = [line for line in lines if line.startswith("warning: ")]
    for needle in (
        f"{policy}:8: rules for admn: no socket has that name",
        f"{policy}:4: knock-window has no effect on a static --knock sequence",
        "1 allow rule(s) for IPv6 (such as 2001:db8::/32",
        "192.0.2.0/24 is both allowed",
        "allow 198.51.100.0/25",
    ):
        assert sum(needle in w for w in warnings) == 1, (needle, warnings)
    assert len(warnings) == 5, warnings
    assert lines[-1] == "ok: the wrapper would start with this policy"
    strict = run_cli("check", "--policy", str(policy), "--strict", "--json")
    assert strict.returncode == 78
    report = json.loads(strict.stdout)
    assert report["ok"] is False and len(report["warnings"]) == 5
    assert report["sockets"][0]["parts"] == ["subnets", "knocking"]
    assert report["sockets"][0]["instructions"] > 0
    clean = run_cli("check", "--allow", "192.0.2.0/24", "--listen", "[::]:8080", "--strict")
    assert clean.returncode == 0 and "warning" not in clean.stdout


def test_check_loads_programs_as_the_units_do(bpf_root: None) -> None:
    """Run as root, check also loads each program with CAP_BPF alone, as the shipped units
    and the loader do: a filter root's verifier takes and theirs refuses is a warning
    (an error with --strict); the example filters are not."""
    leaky = run_cli("check", "--filter", str(ROOT / "tests/data/leaky.c"), "--strict")
    assert leaky.returncode == 78, leaky.stdout + leaky.stderr
    (warning,) = [line for line in leaky.stdout.splitlines() if line.startswith("warning: ")]
    assert "refuses its program with CAP_BPF alone" in warning and "leaks addr" in warning
    for example in ("examples/filters/allowlist.c", "tests/data/allowlist.c"):
        clean = run_cli("check", "--filter", str(ROOT / example), "--strict")
        assert clean.returncode == 0, clean.stdout + clean.stderr
    # Where the caller holds CAP_BPF alone it loaded that way already: an error then.
    capped = subprocess.run(
        ["setpriv", "--bounding-set=-all,+bpf", *WRAPPER, "check", "--filter",
         str(ROOT / "tests/data/leaky.c")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert capped.returncode == 65 and "leaks addr" in capped.stderr, capped.stderr


def add_sources(host: Host, v4: list[str], v6: list[str]) -> None:
    for address in v4:
        ip("-n", host.netns, "addr", "add", f"{address}/24", "dev", host.link)
    for address in v6:
        ip("-n", host.netns, "addr", "add", f"{address}/64", "dev", host.link, "nodad")


def connect_from(host: Host, source: str) -> str:
    target = host.server_v4 if ":" not in source else host.server_v6
    out = subprocess.run(
        host.command(
            [sys.executable, str(CLIENT), "tcp", target, "8080", f"from-{source}", "1.5", source]
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def test_explain_agrees_with_real_traffic(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    a, b, server = network.allowed, network.denied, network.server
    c = Host(f"{server.netns}c")
    ip("netns", "add", c.netns)
    network.names.append(c.netns)
    link_hosts(server, c, f"{server.netns}c0", f"{server.netns}c1", "203.0.113", "2001:db8:c")
    sources = [
        (a, ([f"192.0.2.{i}" for i in (2, 10, 15, 16, 17, 19, 20, 60)],
            [f"2001:db8:a::{i:x}" for i in (2, 0x10, 0x17, 0x18, 0x1b, 0x1c)])),
        (b, ([f"198.51.100.{i}" for i in (2, 10, 62, 63, 64, 65, 100)],
            [f"2001:db8:b::{i:x}" for i in (2, 0x40, 0xff, 0x100)])),
        (c, (["203.0.113.2", "203.0.113.7", "203.0.113.9"], ["2001:db8:c::2", "2001:db8:c::9"])),
    ]  # fmt: skip
    for host, (v4, v6) in sources:
        add_sources(host, v4[1:], v6[1:])  # the first of each is the host's own address
    policy = tmp_path / "web.toml"
    policy.write_text(
        'allow = ["192.0.2.0/25", "198.51.100.0/26", "2001:db8:a::/64", "2001:db8:b::/120",'
        ' "203.0.113.0/24", "2001:db8:c::/64"]\n'
        'deny = ["192.0.2.16/30", "2001:db8:a::18/126", "198.51.100.10"]\n'
        f'interface = ["{a.server_if}", "{b.server_if}"]\n'
        '[[listen]]\naddress = "[::]:8080"\nname = "web"\n'
    )
    svc = Service(server, [*WRAPPER, "--policy", str(policy), "--", *ECHO_SERVER])
    services.append(svc)
    svc.wait_for(r"^ready ")
    pairs = [(host, s) for host, (v4, v6) in sources for s in v4 + v6]
    assert len(pairs) >= 30
    explained = {}
    for host, (v4, v6) in sources:
        mine = v4 + v6
        out = run_cli("explain", "--policy", str(policy), "--interface", host.server_if,
                      *[x for s in mine for x in ("--from", s)], "--json", host=server)  # fmt: skip
        assert out.returncode == 0, out.stderr
        for source, line in zip(mine, out.stdout.splitlines(), strict=True):
            explained[source] = json.loads(line)
    with ThreadPoolExecutor(8) as pool:
        real = dict(
            zip([s for _, s in pairs], pool.map(lambda p: connect_from(*p), pairs), strict=True)
        )
    wrong = {
        s: (explained[s], real[s])
        for s in real
        if (explained[s]["verdict"] == "pass") != (real[s] == "echo")
    }
    assert not wrong, wrong
    verdicts = {(v["verdict"], v["part"]) for v in explained.values()}
    assert {("pass", None), ("drop", "subnets"), ("drop", "interfaces")} <= verdicts, verdicts
    denied = explained["192.0.2.17"]
    assert denied["rule"] == f"192.0.2.17 matches deny 192.0.2.16/30 ({policy} line 2)", denied
    assert explained["203.0.113.7"]["rule"].startswith(f"arrived on {c.server_if}, not one of")


def readme_block(marker: str) -> str:
    text = (ROOT / "docs/rules.md").read_text()
    after = text.split(f"<!-- policy-walkthrough: {marker} -->", 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def sizes_out(text: str) -> str:
    """Program and map sizes depend on the kernel: compare everything else."""
    return re.sub(r"program of \d+ instructions, maps [\d.]+ \w+", "program of N, maps M", text)


def test_readme_policy_walkthrough(bpf_root: None, tmp_path: Path) -> None:
    (tmp_path / "web.toml").write_text(readme_block("web.toml"))
    (tmp_path / "admin-nets.txt").write_text("198.51.100.0/24\n")
    for marker in ("check", "explain"):
        session = readme_block(marker)
        commands = re.split(r"^\$ ", session, flags=re.M)[1:]
        for command in commands:
            line, _, expected = command.partition("\n")
            argv = line.split()
            assert argv[0] == "alfwrapper"
            out = subprocess.run(
                [*WRAPPER, *argv[1:]], capture_output=True, text=True, timeout=120, cwd=tmp_path
            )
            assert out.returncode == 0, out.stderr
            assert sizes_out(out.stdout) == sizes_out(expected), (line, out.stdout)
