"""alfwrapper doctor: the parsers, and the real checks on this host."""

from __future__ import annotations

import pytest

from alfwrapper.observe.doctor import effective_capabilities, kernel_version, platform_check

pytestmark = pytest.mark.unit


def test_kernel_version() -> None:
    assert kernel_version("6.18.44-fc-v669") == (6, 18)
    assert kernel_version("5.6.0") == (5, 6)
    assert kernel_version("weird") == (0, 0)


TRIXIE = 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nVERSION_ID="13"\nID=debian\n'
BOOKWORM = TRIXIE.replace("13 (trixie)", "12 (bookworm)").replace('"13"', '"12"')


def test_doctor_says_which_platform_and_whether_the_tests_run_on_it() -> None:
    """Debian 12 and 13, each on its own kernel or 6.18 (README: Requirements)."""
    on = "a platform the tests run on"
    said = platform_check(TRIXIE, "6.12.118+deb13-amd64", "257")
    assert said.ok and said.text == (
        "Debian GNU/Linux 13 (trixie), kernel 6.12.118+deb13-amd64, systemd 257 as PID 1: " + on
    )
    assert platform_check(BOOKWORM, "6.1.0-56-amd64", "252").text.endswith(on)
    assert platform_check(BOOKWORM, "6.18.44-fc-v1", "252").text.endswith(on)
    assert platform_check(BOOKWORM, "6.18.44", None).text.endswith(
        on + " (the units under systemd 252 as PID 1)"
    )
    for os_release, kernel in (
        (TRIXIE, "6.1.0-56-amd64"),
        (BOOKWORM, "6.12.1"),
        (TRIXIE.replace("ID=debian", "ID=ubuntu"), "6.12.1"),
        ("", "6.12.1"),
    ):
        said = platform_check(os_release, kernel, "257")
        assert said.ok and "not a platform the tests run on" in said.text, said


def test_effective_capabilities() -> None:
    status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n"
    caps = effective_capabilities(status)
    assert caps >> 39 & 1 and caps >> 21 & 1
    assert effective_capabilities("CapEff:\t0000000000000000\n") == 0
