"""The generator: an Accept=yes socket unit's policy as IPAddressAllow= (socket_units.py).

What systemd does with the drop-in (a denied peer never accepted) is the boot tier's:
tests/boot/test_units.py."""

from __future__ import annotations

import ipaddress
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import ROOT

from alfwrapper.lifecycle import socket_units
from alfwrapper.policy.files import build_policy, read_policy
from alfwrapper.policy.prefixes import FAMILY_BITS

pytestmark = pytest.mark.unit

SOCKET = "[Unit]\nDescription=x\n\n[Socket]\nListenStream=22\n{accept}\n{key}\n"


def unit(folder: Path, name: str, accept: str = "Accept=yes", policy: str = "p") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    key = f"X-AlfwrapperPolicy={policy}" if policy else ""
    path.write_text(SOCKET.format(accept=accept, key=key))
    return path


def env(tmp_path: Path, *dirs: Path) -> dict[str, str]:
    return {
        "ALFWRAPPER_POLICY_PATH": str(tmp_path / "policy"),
        "ALFWRAPPER_UNIT_PATH": ":".join(map(str, dirs)),
    }


def policy(tmp_path: Path, text: str, name: str = "p") -> None:
    (tmp_path / "policy").mkdir(exist_ok=True)
    (tmp_path / "policy" / f"{name}.toml").write_text(text)


def allowed_lines(text: str) -> list[str]:
    return [
        p
        for line in text.splitlines()
        if line.startswith("IPAddressAllow=")
        for p in line.removeprefix("IPAddressAllow=").split()
    ]


def test_only_accept_yes_units_that_name_a_policy_first_on_the_path(tmp_path: Path) -> None:
    etc, lib = tmp_path / "etc", tmp_path / "lib"
    unit(etc, "a.socket", policy="first")
    unit(lib, "a.socket", policy="second")  # hidden by /etc's
    unit(lib, "b.socket", accept="Accept=no")
    unit(lib, "c.socket", accept="Accept=true", policy="c")
    unit(lib, "d.socket", policy="")
    unit(lib, "e@.socket")  # a template: its instances' sockets are not this file's
    (etc / "f.socket").symlink_to("/dev/null")  # masked
    unit(lib, "f.socket")
    assert socket_units.opted_in([etc, lib]) == {"a.socket": "first", "c.socket": "c"}


def test_the_drop_in_is_the_union_of_every_sockets_allow_list(tmp_path: Path) -> None:
    policy(
        tmp_path,
        'allow = ["192.0.2.0/24", "::ffff:198.51.100.0/120"]\n'
        'deny = ["192.0.2.7"]\nknock = "7000,8000"\n'
        '[socket.admin]\nallow = ["2001:db8:a::/48"]\n',
    )
    lib = tmp_path / "lib"
    unit(lib, "svc.socket")
    out = tmp_path / "out"
    assert socket_units.generate(out, env(tmp_path, lib)) == 0
    text = (out / "svc.socket.d" / socket_units.DROP_IN).read_text()
    assert os.listdir(out / "svc.socket.d") == [socket_units.DROP_IN]  # written whole, renamed
    assert "\n[Socket]\nIPAddressDeny=any\n" in text
    # Deny lines and knocking narrow what the allow list lets in: the wrapper's to judge.
    assert allowed_lines(text) == ["192.0.2.0/24", "198.51.100.0/24", "2001:db8:a::/48"]


@pytest.mark.parametrize(
    "text",
    [
        'deny = ["192.0.2.7"]\n',  # no allow list: every other source passes
        '[socket.admin]\nallow = ["192.0.2.0/24"]\n',  # a socket of another name passes all
    ],
)
def test_a_policy_that_lets_every_source_in_gets_no_drop_in(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    policy(tmp_path, text)
    lib = tmp_path / "lib"
    unit(lib, "svc.socket")
    socket_units.generate(tmp_path / "out", env(tmp_path, lib))
    assert not (tmp_path / "out").exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("alfwrapper generator: svc.socket: policy p: "), err
    assert "lets every source reach some socket" in err[0]


def test_a_policy_that_cannot_be_read_lets_no_peer_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy(tmp_path, 'allow = ["192.0.2.0/24"\n')  # broken TOML
    lib = tmp_path / "lib"
    unit(lib, "svc.socket")
    unit(lib, "gone.socket", policy="nowhere")
    socket_units.generate(tmp_path / "out", env(tmp_path, lib))
    for name in ("svc.socket", "gone.socket"):
        text = (tmp_path / "out" / f"{name}.d" / socket_units.DROP_IN).read_text()
        assert "IPAddressDeny=any" in text and not allowed_lines(text), text
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("every peer is dropped until it is fixed" in e for e in err)


def test_too_many_prefixes_are_left_to_the_wrapper(tmp_path: Path) -> None:
    rules = tmp_path / "many.rules"
    rules.write_text("".join(f"10.{i >> 8}.{i & 255}.0/24\n" for i in range(10_001)))
    policy(tmp_path, f'allow-file = ["{rules}"]\n')
    lib = tmp_path / "lib"
    unit(lib, "svc.socket")
    socket_units.generate(tmp_path / "out", env(tmp_path, lib))
    assert not (tmp_path / "out").exists()


def test_every_address_any_socket_passes_is_inside_the_drop_in(tmp_path: Path) -> None:
    """The drop-in is never narrower than the policy: seeded random policies of both
    families with scopes and deny lines, and addresses near their prefixes."""
    rng = random.Random(2026)

    def prefix(family: int) -> str:
        bits = FAMILY_BITS[family]
        length = rng.choice([8, 16, 24, 32] if family == 4 else [32, 48, 64, 128])
        base = (0xC0000200 << 96 if family == 6 else 0xC0000200) ^ rng.getrandbits(bits)
        net = ipaddress.ip_network((base >> (bits - length) << (bits - length), length))
        return str(net)

    for trial in range(40):
        lists = {
            k: [prefix(rng.choice((4, 6))) for _ in range(rng.randint(1, 4))]
            for k in ("allow", "deny", "admin")
        }
        policy(
            tmp_path,
            f"allow = {lists['allow']}\ndeny = {lists['deny']}\n"
            f"[socket.admin]\nallow = {lists['admin']}\n",
            name=f"t{trial}",
        )
        entries, listens, files = read_policy(f"t{trial}", env(tmp_path))
        built = build_policy(entries, listens, (), files)
        rendered, _ = socket_units.allowed_prefixes(f"t{trial}", env(tmp_path))
        nets = [ipaddress.ip_network(p) for p in rendered]
        for text in lists["allow"] + lists["deny"] + lists["admin"]:
            net = ipaddress.ip_network(text)
            for address in (net[0], net[-1], net[0] - 1, net[-1] + 1):
                family = address.version
                passes = any(
                    built.rules_for(name).subnets.passes(family, int(address))
                    for name in ("", "admin")
                )
                inside = any(address in n for n in nets if n.version == family)
                assert inside or not passes, (address, lists, rendered)


def test_the_generator_runs_as_systemd_runs_it(tmp_path: Path) -> None:
    """The shipped script, with a bare environment as systemd gives generators."""
    policy(tmp_path, 'allow = ["192.0.2.0/24"]\n')
    lib = tmp_path / "lib"
    unit(lib, "svc.socket")
    script = (ROOT / "units/alfwrapper-generator").read_text()
    assert os.access(ROOT / "units/alfwrapper-generator", os.X_OK)
    runnable = tmp_path / "gen"
    runnable.write_text(script.replace("/usr/bin/alfwrapper", f"{sys.executable} -m alfwrapper"))
    runnable.chmod(0o755)
    out = tmp_path / "normal"
    subprocess.run(
        [str(runnable), str(out), str(tmp_path / "early"), str(tmp_path / "late")],
        check=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env(tmp_path, lib)},
    )
    assert allowed_lines((out / "svc.socket.d" / socket_units.DROP_IN).read_text()) == [
        "192.0.2.0/24"
    ]
