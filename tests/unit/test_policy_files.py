"""Policy files and the command line build the same Policy; layers, drop-ins and errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alfwrapper.bpf.parts import knock_key
from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.errors import EX_CONFIG, EX_NOINPUT, AlfError
from alfwrapper.policy.files import KEYS, SETTINGS, find_policy, read_policy
from alfwrapper.policy.prefixes import parse_prefix
from alfwrapper.record import replace

pytestmark = pytest.mark.unit

SECRET = "correct horse battery staple, but longer\n"


def from_file(tmp_path: Path, text: str, *argv: str, name: str = "p.toml") -> object:
    path = tmp_path / name
    path.write_text(text)
    return parse_policy(["--policy", str(path), *argv])


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "allow.txt").write_text("192.0.2.0/25\n# comment\n2001:db8:1::/48\n")
    (tmp_path / "deny.txt").write_text("192.0.2.66\n")
    (tmp_path / "knock.secret").write_text(SECRET)
    (tmp_path / "alice.key").write_text("alice's own key, long enough\n")
    (tmp_path / "bob.key").write_text("bob's own key, just as long\n")
    (tmp_path / "f.c").write_text("int filter(struct __sk_buff *skb) { return 0; }\n")
    return tmp_path


# Each row: a policy file, and the command line that means the same.  Together they
# use every key.
EQUIVALENT = [
    (
        'allow = ["192.0.2.0/24", "2001:db8::/32"]\ndeny = ["192.0.2.66"]\n'
        'allow-file = ["allow.txt"]\ndeny-file = ["deny.txt"]\ninterface = ["lo"]\n',
        "--allow 192.0.2.0/24 --allow 2001:db8::/32 --deny 192.0.2.66 --allow-file {d}/allow.txt "
        "--deny-file {d}/deny.txt --interface lo",
    ),
    (
        "[socket.admin]\nknock = [7001, 7002, 7003]\nknock-timeout = 2\nknock-open-for = 9\n"
        "knock-sources = 2048\n",
        "--knock admin=7001,7002,7003 --knock-timeout admin=2 --knock-open-for admin=9 "
        "--knock-sources admin=2048",
    ),
    (
        'knock-secret = "knock.secret"\nknock-window = 10\nknock-steps = 4\n',
        "--knock-secret {d}/knock.secret --knock-window 10 --knock-steps 4",
    ),
    (
        'knock-secret = "knock.secret"\nknock-spa = true\nknock-window = 60\n'
        "[socket.admin]\nknock-spa-port = 62201\nknock-spa-sender = true\n",
        "--knock-secret {d}/knock.secret --knock-spa --knock-window 60 "
        "--knock-spa-port admin=62201 --knock-spa-sender admin=yes",
    ),
    (
        'knock-spa = true\nknock-spa-key = ["alice.key"]\n'
        '[socket.admin]\nknock-spa-key = ["bob.key"]\n',
        "--knock-spa --knock-spa-key {d}/alice.key --knock-spa-key admin={d}/bob.key",
    ),
    (
        "log-drops = 20\n[socket.web]\nlog-drops = 5\n",
        "--log-drops 20 --log-drops web=5",
    ),
    (
        'filter = "f.c"\nset = [["m", "1", "2"]]\n[socket.web]\nset = [["m", "3", "4"]]\n',
        "--filter {d}/f.c --set m 1 2 --set web=m 3 4",
    ),
    (
        'allow-set = ["office"]\ndeny-set = ["crowdsec", "spamhaus-drop"]\n'
        '[socket.web]\ndeny-set = ["extra", "crowdsec"]\n',
        "--allow-set office --deny-set crowdsec --deny-set spamhaus-drop "
        "--deny-set web=extra --deny-set web=crowdsec",
    ),
    (
        '[[listen]]\naddress = "[::]:8080"\nname = "web"\n[[listen-datagram]]\n'
        'address = "[::]:8053"\nname = "dns"\n[socket.dns]\nallow = ["2001:db8::/32"]\n',
        "--listen [::]:8080 --name web --listen-datagram [::]:8053 --name dns "
        "--allow dns=2001:db8::/32",
    ),
]


def test_every_key_is_covered_by_the_table() -> None:
    """The keys build_policy fills by code of its own; each setting, declared on its
    field, is held to the same by test_every_setting_reaches_its_field."""
    used = {line.split("=")[0].strip() for text, _ in EQUIVALENT for line in text.splitlines()}
    assert set(KEYS) - set(SETTINGS) <= used


@pytest.mark.parametrize("key", list(SETTINGS))
def test_every_setting_reaches_its_field(files: Path, key: str) -> None:
    """A setting declared on a rule field (policy/rules.py: Rule) is a policy key and an
    option: a value other than its default, in a file or on the command line, is that
    field's, for every socket and for one; a value past its limits is refused both ways.
    In a knock with a secret and SPA, where every knock setting applies."""
    setting = SETTINGS[key]
    switch = isinstance(setting.default, bool)
    value = True if switch else setting.rule.high
    written = "true" if switch else str(value)
    base = 'knock-secret = "knock.secret"\n' + ("" if key == "knock-spa" else "knock-spa = true\n")
    argv = f"--knock-secret {files}/knock.secret" + ("" if key == "knock-spa" else " --knock-spa")
    for scope, option in (("", ""), ("[socket.web]\n", "web=")):
        by_file = from_file(files, f"{base}{scope}{key} = {written}\n")
        by_argv = parse_policy([*argv.split(), f"--{key}", f"{option}{value}"])
        rules = by_file.rules_for("web")  # type: ignore[attr-defined]
        assert rules == by_argv.rules_for("web")  # type: ignore[attr-defined]
        owner = rules.knock if setting.record.__name__ == "KnockRules" else rules
        assert getattr(owner, setting.name) == value
    past = "maybe" if switch else str(setting.rule.high * 2)
    with pytest.raises(AlfError):
        parse_policy([*argv.split(), f"--{key}", past])
    with pytest.raises(AlfError):
        from_file(files, f"{base}{key} = {'1' if switch else past}\n")


@pytest.mark.parametrize(("text", "argv"), EQUIVALENT)
def test_file_and_command_line_give_the_same_rules(files: Path, text: str, argv: str) -> None:
    by_file = from_file(files, text)
    by_argv = parse_policy(argv.format(d=files).split())
    assert by_file.listens == by_argv.listens  # type: ignore[attr-defined]
    for name in ("web", "admin", "dns", "other"):
        assert by_file.rules_for(name) == by_argv.rules_for(name), name  # type: ignore[attr-defined]


def test_named_sets_add_up_per_socket_once_each(tmp_path: Path) -> None:
    policy = from_file(
        tmp_path, 'deny-set = ["a", "b"]\n[socket.web]\ndeny-set = ["c", "a"]\nallow-set = ["o"]\n'
    )
    web, other = policy.rules_for("web"), policy.rules_for("x")  # type: ignore[attr-defined]
    assert web.deny_sets == ("a", "b", "c") and web.allow_sets == ("o",)
    assert other.deny_sets == ("a", "b") and other.allow_sets == ()
    assert not other.empty and other.counts()["set"] == 2


@pytest.mark.parametrize(
    ("text", "argv", "needle"),
    [
        ('deny-set = ["a.b"]\n', (), "p.toml:1: 'a.b' is not a set name"),
        ('deny-set = ["x" ]\nallow-set = [""]\n', (), "is not a set name"),
        ('allow-set = ["o"]\nallow = ["192.0.2.0/24"]\ndeny = ["192.0.2.1"]\n', (), "not both"),
        ('allow-set = ["o"]\n', ("--allow", "192.0.2.0/24", "--deny", "192.0.2.9"), "not both"),
    ],
)
def test_named_set_mistakes(tmp_path: Path, text: str, argv: tuple[str, ...], needle: str) -> None:
    with pytest.raises(AlfError) as caught:
        from_file(tmp_path, text, *argv)
    assert needle in str(caught.value) and caught.value.exit_code == EX_CONFIG, caught.value


def test_relative_paths_resolve_against_the_policy_folder(files: Path, tmp_path: Path) -> None:
    sub = tmp_path / "etc"
    sub.mkdir()
    (sub / "allow.txt").write_text("203.0.113.0/24\n")
    policy = from_file(sub, 'allow-file = ["allow.txt"]\n')
    assert policy.rules_for("x").subnets.allow == (parse_prefix("203.0.113.0/24"),)  # type: ignore[attr-defined]


def test_command_line_adds_to_the_file(tmp_path: Path) -> None:
    policy = from_file(tmp_path, 'allow = ["192.0.2.0/24"]\n', "--allow", "web=198.51.100.0/24")
    web, other = policy.rules_for("web"), policy.rules_for("x")  # type: ignore[attr-defined]
    assert len(web.subnets.allow) == 2 and len(other.subnets.allow) == 1


def write_layers(tmp_path: Path, vendor: str, *dropins: str) -> Path:
    main = tmp_path / "svc.toml"
    main.write_text(vendor)
    folder = tmp_path / "svc.toml.d"
    folder.mkdir()
    for i, text in enumerate(dropins):
        (folder / f"{i:02d}.toml").write_text(text)
    return main


def test_drop_ins_add_clear_and_replace(tmp_path: Path) -> None:
    main = write_layers(
        tmp_path,
        'allow = ["192.0.2.0/24"]\nknock = [1, 2]\nknock-timeout = 3\n',
        'allow = ["198.51.100.0/24"]\n',  # adds
        'deny = ["203.0.113.0/24"]\nknock = [5, 6]\n',  # a later knock replaces
        "knock-timeout = 4\n",
    )
    rules = parse_policy(["--policy", str(main)]).rules_for("x")
    assert [str(p) for p in rules.subnets.allow] == ["192.0.2.0/24", "198.51.100.0/24"]
    assert rules.knock is not None and rules.knock.ports == (5, 6) and rules.knock.timeout == 4
    # An empty list clears what the layers before it gave.
    (tmp_path / "svc.toml.d" / "99.toml").write_text("allow = []\n")
    rules = parse_policy(["--policy", str(main)]).rules_for("x")
    assert rules.subnets.allow == () and len(rules.subnets.deny) == 1


def test_policy_names_are_looked_up_in_order(tmp_path: Path) -> None:
    admin, vendor = tmp_path / "etc", tmp_path / "lib"
    for folder in (admin, vendor):
        (folder / "svc.toml.d").mkdir(parents=True)
    (vendor / "svc.toml").write_text('allow = ["192.0.2.0/24"]\n')
    (vendor / "svc.toml.d" / "10-a.toml").write_text('deny = ["192.0.2.1"]\n')
    (admin / "svc.toml.d" / "10-a.toml").write_text('deny = ["192.0.2.2"]\n')  # overrides
    (admin / "svc.toml.d" / "20-b.toml").write_text('deny = ["192.0.2.3"]\n')
    env = {"ALFWRAPPER_POLICY_PATH": f"{admin}:{vendor}"}
    found = find_policy("svc", env)
    assert found == [
        vendor / "svc.toml",
        admin / "svc.toml.d/10-a.toml",
        admin / "svc.toml.d/20-b.toml",
    ]
    (admin / "svc.toml").write_text('allow = ["198.51.100.0/24"]\n')
    assert find_policy("svc", env)[0] == admin / "svc.toml"
    entries, _, files = read_policy("svc", env)
    assert files[0] == str(admin / "svc.toml") and len(entries) == 3
    with pytest.raises(AlfError) as info:
        find_policy("nosuch", env)
    assert info.value.exit_code == EX_NOINPUT and "no nosuch.toml in" in info.value.line()


BAD = [
    ("allow = [\n", "p.toml:", "TOML"),
    ('alow = ["192.0.2.0/24"]\n', "p.toml:1", "unknown key 'alow'"),
    ('allow = ["192.0.2.0/24"]\n\n[socket.web]\nknok = [1, 2]\n', "p.toml:4", "unknown key 'knok'"),
    ('allow = "192.0.2.0/24"\n', "p.toml:1", "must be a list of strings"),
    ('knock-timeout = "fast"\n', "p.toml:1", "must be a number"),
    ('allow = ["192.0.2.0/24",\n  "192.0.2.5/24"]\n', "p.toml:2", "host bits set"),
    ("knock = [7001, 7001]\n", "p.toml:1", "follows itself"),
    ("knock-steps = 9\n", "p.toml:1", "out of range"),
    ('[[listen]]\naddress = "localhost:80"\n', "p.toml:2", "not an IP address"),
    ('[[listen]]\naddress = "[::]:80"\nport = 8\n', "p.toml:3", "unknown key 'port'"),
    ('set = [["m", "1"]]\n', "p.toml:1", "[map, key, value]"),
]


@pytest.mark.parametrize(("text", "where", "why"), BAD)
def test_bad_policy_files(tmp_path: Path, text: str, where: str, why: str) -> None:
    with pytest.raises(AlfError) as info:
        from_file(tmp_path, text)
    line = info.value.line()
    assert where in line and why in line, line
    assert info.value.exit_code == EX_CONFIG
    assert "\n" not in line


def test_missing_referenced_file(tmp_path: Path) -> None:
    with pytest.raises(AlfError) as info:
        from_file(tmp_path, 'deny-file = ["nosuch.txt"]\n')
    assert info.value.exit_code == EX_NOINPUT
    assert str(tmp_path / "nosuch.txt") in info.value.line()


def test_drop_in_that_breaks_the_vendor_file_is_named(tmp_path: Path) -> None:
    main = write_layers(tmp_path, 'allow = ["192.0.2.0/24"]\n', "\n\nknock-window = 1\n")
    with pytest.raises(AlfError) as info:
        parse_policy(["--policy", str(main)])
    assert f"{tmp_path}/svc.toml.d/00.toml:3" in info.value.line()
    assert "out of range" in info.value.line()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_policy_or_one_clear_error(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    folder = tmp_path_factory.mktemp("hyp")
    try:
        from_file(folder, text)
    except AlfError as err:
        assert "\n" not in err.line()


@pytest.mark.parametrize(
    ("name", "valid"),
    [("admin", True), ("web admin", True), ("ssh@v6", True), ("a" * 255, True),
     ("a:b", False), ("", False), ("a" * 256, False), ("tab\there", False), ("é", False)],
)  # fmt: skip
def test_socket_names_follow_one_rule_everywhere(tmp_path: Path, name: str, valid: bool) -> None:
    """--name, a policy's [socket.NAME] and a [[listen]] name take what systemd's
    FileDescriptorName= takes, and refuse the rest alike."""
    quoted = name.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t")
    attempts = [
        lambda: parse_policy(["--listen", "[::1]:80", "--name", name, "--allow", "::1"]),
        lambda: from_file(tmp_path, f'[socket."{quoted}"]\nallow = ["::1"]\n'),
        lambda: from_file(tmp_path, f'[[listen]]\naddress = "[::1]:80"\nname = "{quoted}"\n'),
    ]
    for attempt in attempts:
        if valid:
            attempt()
        else:
            with pytest.raises(AlfError, match="not a (valid )?socket name"):
                attempt()


@pytest.mark.parametrize(
    ("text", "argv", "needle"),
    [
        ("knock-spa = true\n", (), "p.toml:1: SPA needs a secret"),
        ("knock = [7001, 7002]\nknock-spa = true\n", (), "SPA needs a secret"),
        ('knock-secret = "knock.secret"\nknock-spa-port = 9000\n', (), "without knock-spa"),
        ('knock-secret = "knock.secret"\nknock-spa-sender = true\n', (), "without knock-spa"),
        ('knock-secret = "knock.secret"\nknock-spa = "yes"\n', (), "must be true or false"),
        ('knock-secret = "knock.secret"\n', ("--knock-spa", "maybe"), "is not yes or no"),
        ('knock-secret = "knock.secret"\n', ("--knock-spa", "--knock-spa-port", "0"),
         "out of range"),
        ('knock-spa-key = ["alice.key"]\n', (), "knock-spa-key without knock-spa"),
        ('knock-secret = "alice.key"\nknock-spa = true\nknock-spa-key = ["alice.key"]\n', (),
         "two keys have the id"),
        ('knock = [7001, 7002]\nknock-spa-key = ["alice.key"]\n', (), "without knock-spa"),
        ('knock-spa = true\nknock-spa-key = ["short.key"]\n', (), "only 5 bytes"),
    ],
)  # fmt: skip
def test_spa_settings_that_cannot_work_are_refused(
    files: Path, text: str, argv: tuple[str, ...], needle: str
) -> None:
    (files / "short.key").write_text("short")
    with pytest.raises(AlfError) as caught:
        from_file(files, text, *argv)
    assert needle in caught.value.line(), caught.value.line()


def test_the_spa_socket_has_its_sockets_rules_and_checks_datagrams(files: Path) -> None:
    policy = from_file(
        files,
        'knock-secret = "knock.secret"\nknock-spa = true\n'
        'allow = ["192.0.2.0/24"]\nfilter = "f.c"\n',
    )
    web, door = policy.rules_for("web"), policy.rules_for("web.spa")  # type: ignore[attr-defined]
    assert web.knock.spa and not web.knock.verifier
    assert door.knock == replace(web.knock, verifier=True)
    assert door.subnets == web.subnets and door.custom is None and web.custom is not None
    assert knock_key(door) == knock_key(web)  # one knock state: the one opens, the other reads
    plain = from_file(files, 'knock-secret = "knock.secret"\n')
    assert plain.rules_for("web.spa") == plain.rules_for("other")  # type: ignore[attr-defined]


def test_a_clients_key_keeps_the_knock_state_where_it_was(files: Path) -> None:
    """Clients' own keys are the SPA socket's alone: adding one, or revoking one, keeps
    the knock state (who is open now) where it was, and the keys come in order, once."""
    one = from_file(files, 'knock-spa = true\nknock-spa-key = ["alice.key"]\n')
    two = from_file(
        files,
        'knock-spa = true\nknock-spa-key = ["alice.key", "bob.key"]\n'
        '[socket.admin]\nknock-spa-key = ["alice.key"]\n',
    )
    web, admin = two.rules_for("web"), two.rules_for("admin")  # type: ignore[attr-defined]
    assert knock_key(one.rules_for("web")) == knock_key(web)  # type: ignore[attr-defined]
    assert [k[:5] for k in web.knock.spa_keys] == [b"alice", b"bob's"]
    assert admin.knock.spa_keys == web.knock.spa_keys  # alice's twice is alice's once
