"""Scopes, knock sequences and program composition: the pure parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from alfwrapper.bpf.program import plan_program
from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.errors import AlfError
from alfwrapper.policy.files import split_scope
from alfwrapper.policy.knocking import FIRST_PORT, plan_knock, secret_ports
from alfwrapper.policy.rules import KnockRules, SocketRules, parse_ports

pytestmark = pytest.mark.unit


def rules_for(argv: list[str], name: str) -> SocketRules:
    config = parse_policy(argv)
    return config.rules_for(name)


def test_split_scope() -> None:
    assert split_scope("admin=192.0.2.0/24") == ("admin", "192.0.2.0/24")
    assert split_scope("192.0.2.0/24") == (None, "192.0.2.0/24")
    assert split_scope("2001:db8::/32") == (None, "2001:db8::/32")
    assert split_scope("/etc/a=b") == (None, "/etc/a=b")


def test_scoped_rules_add_up_and_replace() -> None:
    argv = [
        "--deny",
        "203.0.113.0/24",
        "--allow",
        "admin=192.0.2.0/24",
        "--knock",
        "1,2",
        "--knock",
        "admin=3,4",
        "--interface",
        "admin=lo",
    ]
    admin, web = rules_for(argv, "admin"), rules_for(argv, "web")
    assert len(admin.subnets.deny) == 1 and len(admin.subnets.allow) == 1
    assert len(web.subnets.deny) == 1 and not web.subnets.allow
    assert admin.knock is not None and admin.knock.ports == (3, 4)
    assert web.knock is not None and web.knock.ports == (1, 2)
    assert admin.interfaces == ("lo",) and web.interfaces == ()


def test_sets_follow_the_filter() -> None:
    argv = ["--filter", "f.c", "--set", "m", "1", "2", "--set", "admin=m", "3", "4"]
    admin, web = rules_for(argv, "admin"), rules_for(argv, "web")
    assert admin.custom is not None and len(admin.custom.sets) == 2
    assert web.custom is not None and len(web.custom.sets) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--knock", "1,2", "--knock-secret", "/dev/null"], "more than one knock rule"),
        (["--knock", "1,70000"], "not a list of ports"),
        (["--knock", "1,2,3,4,5,6,7,8,9"], "give 1 to 8"),
        (["--knock-timeout", "0"], "--knock-timeout"),
        (["--filter", "a.c", "--filter", "b.c"], "more than one filter"),
        (["--interface", "a/b"], "not an interface name"),
    ],
)
def test_rule_option_errors(argv: list[str], message: str) -> None:
    with pytest.raises(AlfError) as info:
        parse_policy(argv)
    assert message in info.value.line()
    assert info.value.exit_code == 64


def test_parse_ports() -> None:
    assert parse_ports("7001, 7002") == (7001, 7002)


def test_secret_ports_are_stable_distinct_and_in_range() -> None:
    secret = b"s" * 32
    ports = secret_ports(secret, 12345, 8)
    assert ports == secret_ports(secret, 12345, 8)
    assert ports != secret_ports(secret, 12346, 8)
    assert ports != secret_ports(b"t" * 32, 12345, 8)
    assert len(set(ports)) == 8
    assert all(FIRST_PORT <= p <= 65535 for p in ports)


def test_repeated_static_port_is_refused() -> None:
    with pytest.raises(AlfError, match="follows itself"):
        plan_knock(KnockRules(ports=(7001, 7001, 7002)))


def test_program_holds_only_the_parts_in_use() -> None:
    config = parse_policy(["--interface", "lo"])
    text = plan_program(config.rules_for("x")).text
    entry = text.split("alfwrapper-composed.c")[-1]
    assert "interfaces_pass" in entry
    assert "subnets_pass" not in entry and "knock_pass" not in entry
    assert "BPF_HASH(subnet_nodes" not in text
    config = parse_policy(["--allow", "192.0.2.0/24", "--knock", "1,2"])
    entry = plan_program(config.rules_for("x")).text.split("alfwrapper-composed.c")[-1]
    assert entry.index("subnets_pass") < entry.index("knock_pass")


def test_rules_go_into_maps_not_into_code() -> None:
    # Rules of the same shape compile to the same program: only the maps differ.
    a = plan_program(rules_for(["--allow", "192.0.2.0/24", "--deny", "192.0.2.7"], "x"))
    b = plan_program(rules_for(["--allow", "198.51.100.0/24", "--deny", "198.51.100.9"], "x"))
    assert (a.text, a.defines) == (b.text, b.defines)
    assert a.data("subnets") != b.data("subnets")
    assert "192.0.2" not in a.text and "c00002" not in a.text.lower()
    # Another shape (blocks split by longer prefixes in two places) changes the layout
    # settings (the number of IPv4 leaves).
    two = ["--allow", "192.0.2.0/24", "--deny", "192.0.2.7"]
    two += ["--allow", "198.51.100.0/24", "--deny", "198.51.100.9"]
    c = plan_program(rules_for(two, "x"))
    assert a.defines != c.defines


def test_every_part_and_reason_is_counted_in_order() -> None:
    argv = ["--interface", "lo", "--allow", "192.0.2.0/24", "--knock", "1,2", "--filter", "f.c"]
    rules = rules_for(argv, "x")
    # The filter file need not exist to plan the rest; plan without it.
    from alfwrapper.record import replace  # noqa: PLC0415

    plan = plan_program(replace(rules, custom=None))
    body = plan.text.split("alfwrapper-composed.c")[-1]
    order = [
        body.index(f"ALF_REASON_{r})")
        for r in ("MALFORMED", "INTERFACES", "SUBNETS", "KNOCKING", "PASSED")
    ]
    assert order == sorted(order), body
    assert dict(plan.defines)["ALF_REASONS"] == "6"


def test_drop_log_is_in_the_program_only_when_asked_for() -> None:
    off = plan_program(rules_for(["--allow", "192.0.2.0/24"], "x"))
    on = plan_program(rules_for(["--allow", "192.0.2.0/24", "--log-drops", "7"], "x"))
    assert "ALF_LOG_RATE" not in dict(off.defines)
    assert dict(on.defines)["ALF_LOG_RATE"] == "7"
    # Without the setting, common.h's logging is compiled out (#ifdef ALF_LOG_RATE).
    assert "#ifdef ALF_LOG_RATE" in off.text and "struct alf_event {" not in off.text
    assert "struct alf_event {" in on.text


@pytest.mark.parametrize(
    ("argv", "ports"),
    [
        (["--allow", "192.0.2.0/24"], False),
        (["--allow", "192.0.2.0/24", "--interface", "lo"], False),
        (["--allow", "192.0.2.0/24", "--log-drops", "7"], False),  # alf_log reads its own
        (["--allow", "192.0.2.0/24", "--knock", "1,2"], True),  # knocks are ports and SYNs
    ],
)
def test_the_transport_header_is_read_only_where_a_part_reads_it(
    argv: list[str], ports: bool
) -> None:
    """common.h reads ports and TCP flags only with ALF_PORTS: a third of a subnet
    filter's cost, for headers the kernel checked before any socket filter runs."""
    plan = plan_program(rules_for(argv, "x"))
    assert ("ALF_PORTS" in dict(plan.defines)) == ports
    assert "pkt->has_ports = 0;\n#ifndef ALF_PORTS" in plan.text  # alf_parse_packet's


def test_a_developers_filter_gets_the_transport_header(tmp_path: Path) -> None:
    mine = tmp_path / "mine.c"
    mine.write_text("int filter(struct __sk_buff *skb) { return -1; }\n")
    plan = plan_program(rules_for(["--filter", str(mine)], "x"))
    assert dict(plan.defines)["ALF_PORTS"] == "1"


@pytest.mark.parametrize(
    ("service", "protocol", "port", "label"),
    [
        ("web", "tcp", 8080, "web_t8080"),
        ("alfwrapper-echo", "udp", 8080, "alfw_u8080"),  # cut to fit, '-' is not allowed
        ("9lives", "tcp", 22, "s9live_t22"),  # a C identifier starts with a letter
        ("x", "udp", 65535, "x_u65535"),
    ],
)
def test_labels_name_service_and_socket_within_kernel_limits(
    service: str, protocol: str, port: int, label: str
) -> None:
    from alfwrapper.bpf.program import label as make_label  # noqa: PLC0415
    from alfwrapper.bpf.program import object_name  # noqa: PLC0415

    got = make_label(service, protocol, port)
    assert got == label
    assert len(object_name(got, "knock_listeners")) <= 15
    assert object_name(got, "alf_counters") == f"{label}.cnt"[:15]
    plan = plan_program(rules_for(["--interface", "lo"], "x"), label_=got)
    assert plan.programs == {plan.entry: got, plan.body: f"{got}_b"}
    # The C does not name the socket: every socket with these rules has the same
    # program, and so the same program cache entry.
    assert got not in plan.text
    assert plan.text == plan_program(rules_for(["--interface", "lo"], "x"), label_="y_u1").text
