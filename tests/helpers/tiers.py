"""The test tiers: a test's folder is its tier, and its module says so."""

from __future__ import annotations

from pathlib import Path

# The tiers, as pytest markers.  A test's folder is its tier, and each test module says
# so itself (`pytestmark = pytest.mark.TIER`): a module whose marker is not its folder's
# is refused at collection.  `make test-fast` runs unit and host, `make test` all.
TIERS = {
    "unit": "tests/unit: pure Python; no root, no kernel, nothing `make dev` does not install",
    "host": "tests/host: as root on this host, with what `make setup` installs: BPF on "
    "this kernel, Debian's daemons; no network namespaces",
    "netns": "tests/netns: hosts in network namespaces joined by veth pairs",
    "systemd": "tests/systemd: a systemd --user manager with the shipped units",
    "release": "tests/release: the package, the install and the benchmark smoke run",
    "thorough": "tests/thorough: long fuzz and stress runs on this kernel (the loader's "
    "compile confinement, a thousand starts)",
    "boot": "tests/boot: a booted guest, Debian 12 and 13 under nspawn, or under qemu "
    "with their own kernels (6.1, 6.12)",
    "kernel": "tests/kernel: every program alfwrapper generates, through the verifiers "
    "of Debian's kernels (6.1, 6.12, under qemu) and this host's",
}


# What only the other tiers may use: root, BPF, namespaces, managers, guests, the package.
NOT_UNIT = {"bpf_root", "network", "services", "manager", "users", "loader", "readable_copy",
            "deb", "guest", "qemu_guest"}  # fmt: skip


def tier_problem(nodeid: str, marked: set[str], fixtures: set[str]) -> str | None:
    """Why a test's tier is not what its folder says, or None: ``marked`` its markers,
    ``fixtures`` the fixtures it uses."""
    folder = Path(nodeid.partition("::")[0]).parent.name
    tiers = sorted(marked & set(TIERS))
    if folder not in TIERS:
        return f"{nodeid}: tests/{folder} is no tier's folder ({', '.join(TIERS)})"
    if tiers != [folder]:
        return (
            f"{nodeid}: in tests/{folder}, but marked {tiers or 'with no tier'}: its "
            f"module needs `pytestmark = pytest.mark.{folder}` and no other tier"
        )
    if folder == "unit" and fixtures & NOT_UNIT:
        return f"{nodeid}: a unit test, but it uses {sorted(fixtures & NOT_UNIT)}: move it"
    return None
