"""alfwrapper crowdsec: a CrowdSec bouncer that keeps a named set equal to the bans of a
Local API (LAPI), for every service of the host that names the set.

It polls GET /v1/decisions/stream (the LAPI's bouncer API, with the key of
`cscli bouncers add`): the first answer (startup=true) is every ban in force, and
the set is made equal to it (entries it holds that the LAPI does not are removed:
the set is the bouncer's own); later answers are what changed.  Each entry lapses
at its decision's end by itself (sets.c compares the expiry with the kernel's
clock), so a ban ends on time even while the bouncer or the LAPI is down.  After
any failure (the LAPI restarted or unreachable, an answer cut short or malformed)
the next poll starts again with startup=true: a full resync, so nothing is lost
and nothing counted twice.  policy/crowdsec.py reads the answers and keeps the
book of decisions; this module is the loop, the HTTP client (requests, Debian's
python3-requests) and the counters `status --prometheus` shows.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import ipaddress
import json
import os
import signal
import stat
import struct
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from alfwrapper import sets
from alfwrapper.errors import EX_CONFIG, EX_NOINPUT, EX_PROTOCOL, AlfError, excerpt
from alfwrapper.lifecycle import cut
from alfwrapper.policy.crowdsec import (
    WIDEST_IPV4,
    WIDEST_IPV6,
    Book,
    load_answer,
    read_answer,
)
from alfwrapper.policy.inputs import read_input
from alfwrapper.policy.prefixes import Prefix
from alfwrapper.policy.rules import SET_NAME_RULE, valid_set_name
from alfwrapper.record import Record, as_dict, field

CONFIG = "/etc/alfwrapper/crowdsec.toml"
METRICS = "/run/alfwrapper-crowdsec/metrics.json"
CONFIG_LIMIT = 64 << 10
KEY_LIMIT = 4096
METRICS_LIMIT = 64 << 10  # bytes of the metrics file root reads (a few hundred in use)
ANSWER_LIMIT = 256 << 20  # bytes of one answer: a million decisions at ~250 bytes
SCOPES = ("ip", "range")


class Config(Record):
    url: str = "http://127.0.0.1:8080/"
    key: str = field(default="", repr=False)
    set: str = "crowdsec"
    scopes: tuple[str, ...] = SCOPES
    interval: float = 10.0
    timeout: float = 30.0  # seconds for one answer, whole
    metrics: str = METRICS
    widest: tuple[int, int] = (WIDEST_IPV4, WIDEST_IPV6)  # prefix lengths (crowdsec.py)


def read_config(path: str, key_file: str = "", need_key: bool = True) -> Config:
    """The bouncer's TOML file, every key checked: one AlfError naming the file.  The
    key is read from ``key_file`` if given, else from its api-key-file."""
    text = read_input(path, "crowdsec config", CONFIG_LIMIT)

    def bad(why: str, hint: str) -> AlfError:
        return AlfError(f"crowdsec config {path}", why, hint, EX_CONFIG)

    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise bad(f"is not TOML: {err}", "see man alfwrapper: CROWDSEC") from None
    known = {"lapi-url", "api-key-file", "set", "scopes", "poll-interval", "timeout",
             "metrics-file", "widest-ipv4", "widest-ipv6", "insecure-http"}  # fmt: skip
    unknown = sorted(set(data) - known)
    if unknown:
        raise bad(f"has an unknown key {unknown[0]!r}", f"the keys: {', '.join(sorted(known))}")
    url = _lapi_url(data, bad)
    key = _api_key(data, key_file, need_key, bad)
    name = data.get("set", Config.set)
    if not valid_set_name(name):
        raise bad(f"set {excerpt(str(name))} is not a set name", SET_NAME_RULE)
    scopes = data.get("scopes", list(SCOPES))
    if not isinstance(scopes, list) or not scopes or not set(map(str, scopes)) <= set(SCOPES):
        raise bad(
            f"scopes {excerpt(str(scopes))} are not a list of ip and range",
            'write scopes = ["ip", "range"]',
        )
    numbers = _seconds(data, bad)
    widest = _widest(data, bad)
    metrics = data.get("metrics-file", METRICS)
    if not isinstance(metrics, str) or not metrics.startswith("/"):
        raise bad(f"metrics-file {excerpt(str(metrics))} is not an absolute path", "give one")
    return Config(
        url=url if url.endswith("/") else url + "/",
        key=key,
        set=name,
        scopes=tuple(dict.fromkeys(map(str, scopes))),
        interval=numbers["poll-interval"],
        timeout=numbers["timeout"],
        metrics=metrics,
        widest=widest,
    )


# How read_config says what is wrong in its file: bad(why, hint).
Bad = Callable[[str, str], AlfError]


def _lapi_url(data: dict[str, Any], bad: Bad) -> str:
    """The config's lapi-url, refused if it would send the key in clear to another host
    (unless insecure-http says to)."""
    url = data.get("lapi-url", Config.url)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 512:
        raise bad(
            f"lapi-url {excerpt(str(url))} is not an http(s) URL",
            "give the LAPI's URL, e.g. http://127.0.0.1:8080/",
        )
    insecure = data.get("insecure-http", False)
    if not isinstance(insecure, bool):
        raise bad(f"insecure-http {excerpt(str(insecure))} is not true or false", "write one")
    if url.startswith("http://") and not insecure and not _loopback(url):
        raise bad(
            f"lapi-url {excerpt(url)} would send the key in clear to another host",
            "use https://, or write insecure-http = true to send it anyway",
        )
    return url


def _api_key(data: dict[str, Any], key_file: str, need_key: bool, bad: Bad) -> str:
    """The LAPI key, from ``key_file`` or the config's api-key-file, whose mode is
    checked (_check_private); "" unless ``need_key``."""
    given = key_file or data.get("api-key-file")
    if not isinstance(given, str):
        raise bad("has no api-key-file", "name the file holding `cscli bouncers add`'s key")
    key = ""
    if need_key or key_file:  # --prepare --key-file: the unit's, checked as root
        _check_private(given, bad)
    if need_key:
        raw = read_input(given, "crowdsec api-key-file", KEY_LIMIT)
        key = raw.decode("ascii", "replace").strip()
        if not key or not key.isprintable() or not key.isascii():
            raise bad(
                f"{given} holds no key", "write the key `cscli bouncers add NAME -o raw` gave"
            )
    return key


def _seconds(data: dict[str, Any], bad: Bad) -> dict[str, float]:
    """The config's poll-interval and timeout, each in its range."""
    numbers = {}
    for option, default, low, high in (
        ("poll-interval", Config.interval, 0.1, 3600.0),
        ("timeout", Config.timeout, 1.0, 600.0),
    ):
        value = data.get(option, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (low <= value <= high)
        ):
            raise bad(
                f"{option} {excerpt(str(value))} is out of range",
                f"give {low:g} to {high:g} seconds",
            )
        numbers[option] = float(value)
    return numbers


def _widest(data: dict[str, Any], bad: Bad) -> tuple[int, int]:
    """The config's widest-ipv4 and widest-ipv6: the widest bans applied."""
    widest = []
    for option, default, longest in (
        ("widest-ipv4", WIDEST_IPV4, 32),
        ("widest-ipv6", WIDEST_IPV6, 128),
    ):
        value = data.get(option, default)
        # From 1: a /0 bans every source of every service naming the set, never a ban.
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= longest:
            raise bad(
                f"{option} {excerpt(str(value))} is not a prefix length 1 to {longest}",
                f"give the widest ban to apply, e.g. {default}; /0 never is",
            )
        widest.append(value)
    return widest[0], widest[1]


def _loopback(url: str) -> bool:
    """Whether the URL's host is this host's loopback (127.0.0.0/8, ::1, localhost),
    where a key in clear crosses no network."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    if host.rstrip(".").lower() == "localhost":  # RFC 6761: always loopback
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# POSIX ACL entries (linux/posix_acl_xattr.h): tag, permissions, id.
_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER = 0x02, 0x04, 0x08, 0x10, 0x20


def _check_private(path: str, bad: Bad) -> None:
    """Refuse a key file that anyone but its owner and this process's user may use,
    as ssh refuses a private key: whoever reads the key can poll the LAPI as this
    bouncer, and whoever writes it can swap it.  An ACL is read as the kernel reads
    it: systemd hands a credential over as root's file, mode 0400, with one ACL
    entry giving the service's user read (its group bits are then the ACL's mask)."""
    try:
        info = os.stat(path)
    except OSError as err:
        what = f"crowdsec api-key-file {excerpt(path, 200, quote=False)}"
        raise AlfError(what, err.strerror or str(err), "check the path", EX_NOINPUT) from None
    others = info.st_mode & 0o077
    try:
        acl = os.getxattr(path, "system.posix_acl_access")
    except OSError as err:
        if err.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
            raise bad(f"api-key-file {path}: {err.strerror}", "check it") from None
        acl = b""
    if len(acl) > 4:  # a version word, then (tag, permissions, id) entries
        entries = list(struct.iter_unpack("<HHI", acl[4 : 4 + (len(acl) - 4) // 8 * 8]))
        mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 7)
        others = 0
        for tag, perm, ident in entries:
            if tag in (_ACL_GROUP_OBJ, _ACL_GROUP) or (tag == _ACL_USER and ident != os.geteuid()):
                others |= perm & mask
            elif tag == _ACL_OTHER:
                others |= perm
    if others:
        raise bad(
            f"api-key-file {path} is open to others (mode {stat.S_IMODE(info.st_mode):04o})",
            f"chmod 600 {path}, as for an ssh private key",
        )


class Counters(Record, frozen=False):
    """What `status --prometheus` shows of the bouncer (alfwrapper_crowdsec_*)."""

    polls: int = 0
    failures: int = 0
    resyncs: int = 0
    added: int = 0  # entries held or extended
    removed: int = 0
    skipped: int = 0  # decisions that are not bans of an Ip or a Range
    malformed: int = 0  # decisions that could not be read (left out)
    too_wide: int = 0  # bans wider than widest-ipv4/-ipv6 (left out)
    unstored: int = 0  # the last poll's bans the set could not take (sets.NotWhole)
    entries: int = 0
    last_success: float = 0.0  # wall-clock seconds
    apply_seconds: float = 0.0  # the last answer's, from its arrival to the set changed


def lapi_error(config: Config, why: str, hint: str, code: int = EX_PROTOCOL) -> AlfError:
    return AlfError(f"the CrowdSec LAPI {config.url}", why, hint, code)


def fetch(session: Any, config: Config, startup: bool) -> bytes:
    """One answer of the stream, whole and bounded in size and time."""
    import requests  # noqa: PLC0415

    def lapi(why: str, hint: str, code: int = EX_PROTOCOL) -> AlfError:
        return lapi_error(config, why, hint, code)

    deadline = time.monotonic() + config.timeout
    params = {"startup": "true" if startup else "false", "scopes": ",".join(config.scopes)}
    timeouts = (min(10.0, config.timeout), config.timeout)
    url = f"{config.url}v1/decisions/stream"
    # requests' timeouts bound each wait for a byte, not the answer: a LAPI that sends
    # a byte a minute is stopped by the clock (SIGALRM; the bouncer's one thread).
    previous = signal.signal(signal.SIGALRM, _too_slow)
    signal.setitimer(signal.ITIMER_REAL, config.timeout)
    try:
        with session.get(url, params=params, stream=True, timeout=timeouts) as answer:
            if answer.status_code in (401, 403):
                raise lapi("refused the bouncer's key", "check api-key-file", EX_CONFIG)
            if answer.status_code != 200:
                raise lapi(f"answered HTTP {answer.status_code}", "check the LAPI's log")
            body = bytearray()
            for chunk in answer.iter_content(1 << 16):
                body += chunk
                if len(body) > ANSWER_LIMIT or time.monotonic() > deadline:
                    raise lapi(
                        f"sent more than {ANSWER_LIMIT >> 20} MiB or took more than "
                        f"{config.timeout:g} s",
                        "check the LAPI",
                    )
    except requests.RequestException as err:
        raise lapi(
            f"cannot be reached ({err})", "is it running? the set keeps what it had"
        ) from None
    except _TooSlow:
        raise lapi(f"took more than {config.timeout:g} s to answer", "check the LAPI") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return bytes(body)


class _TooSlow(Exception):
    pass


def _too_slow(signum: int, frame: object) -> None:
    raise _TooSlow


def poll_once(session: Any, config: Config, book: Book, synced: bool, counts: Counters) -> None:
    """One poll: a full resync unless ``synced``, else the changes since the last."""
    data = fetch(session, config, startup=not synced)
    arrived = time.monotonic()
    # An answer may bring a million decisions, each a few objects that live on: the
    # cyclic collector would walk them again and again while they are made (a third
    # of the time at 100,000), and none of them can form a cycle.
    gc.disable()
    try:
        try:
            parsed = load_answer(data)
        except (ValueError, RecursionError) as err:
            raise lapi_error(config, f"sent no JSON ({err})", "check lapi-url") from None
        try:
            now = _apply(parsed, config, book, synced, counts)
        except BaseException:
            # Stopped half way (memory, a set past its most): the metrics say what the
            # set holds now, not what the book held before (the next poll resyncs).
            with contextlib.suppress(AlfError, OSError):
                counts.entries = sets.count(config.set)
            raise
        counts.apply_seconds = time.monotonic() - arrived
        # What the set need not wait for: the book's heap of expiries (networks
        # settles it), and freeing the answer's objects (parsed, when this returns).
        counts.entries = book.networks(now)
    finally:
        gc.enable()


def _apply(parsed: Any, config: Config, book: Book, synced: bool, counts: Counters) -> int:
    """Apply an answer to the book and the set; the time it read it at."""
    now = sets.now_ns()
    answer = read_answer(parsed, now, config.widest)
    counts.skipped += answer.skipped
    counts.malformed += answer.malformed
    if answer.too_wide:
        counts.too_wide += len(answer.too_wide)
        # One line a poll, not one a ban: a blocklist of wide ranges would flood the journal.
        shown = ", ".join(map(str, answer.too_wide[:3]))
        more = f" and {len(answer.too_wide) - 3} more" if len(answer.too_wide) > 3 else ""
        print(
            f"alfwrapper crowdsec: left out {len(answer.too_wide)} bans wider than "
            f"/{config.widest[0]} (IPv4) or /{config.widest[1]} (IPv6): {shown}{more} "
            f"(widest-ipv4 and widest-ipv6 in the config; /0 is never applied)",
            file=sys.stderr,
            flush=True,
        )
    sets.sweep(config.set, ("ranges",))  # lapsed ranges hide those they are nested in
    if synced:
        changes = book.delta(answer, now)
        if changes.remove:
            counts.removed += sets.delete(config.set, sorted(changes.remove))
        if changes.hold:
            sets.hold(config.set, changes.hold)
            counts.added += len(changes.hold)
            cut_bans(config.set, list(changes.hold))
    else:
        hold = book.snapshot(answer, now)
        counts.removed += sets.assign(config.set, hold)
        counts.added += len(hold)
        counts.resyncs += 1
        cut_bans(config.set, list(hold))
    return now


# What could not be cut, said once a reason (each poll would say it again).
_SAID: set[str] = set()


def cut_bans(name: str, banned: Sequence[Prefix]) -> None:
    """Reset the live connections the set's new bans now deny (lifecycle/cut.py), once
    the set holds them."""
    report = cut.cut_for_set(name, banned)
    for line in report.done:
        print(f"alfwrapper crowdsec: {line}", flush=True)
    for line in report.problems:
        if line not in _SAID:
            _SAID.add(line)
            print(f"alfwrapper crowdsec: note: {line}", file=sys.stderr, flush=True)


def write_metrics(path: str, counts: Counters) -> None:
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return
    temp = f"{path}.{os.getpid()}"
    try:
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(as_dict(counts), f)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except OSError as err:
        print(f"alfwrapper crowdsec: note: cannot write {path}: {err.strerror}", file=sys.stderr)


def run(config: Config, once: bool = False) -> int:
    """Poll until SIGTERM or SIGINT; every failure is one line on stderr (the journal),
    and the next poll resyncs.  ``once``: one resync, and its error raised."""
    import requests  # noqa: PLC0415

    sets.load_bulk()
    sets.create(config.set)  # nothing if it exists
    session = requests.Session()
    # identity: a compressed answer could grow past ANSWER_LIMIT a chunk at a time.
    session.headers.update(
        {
            "X-Api-Key": config.key,
            "User-Agent": "alfwrapper-crowdsec",
            "Accept-Encoding": "identity",
        }
    )
    book, synced, counts = Book.empty(), False, Counters()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    if once:
        poll_once(session, config, book, False, counts)
        print(
            f"alfwrapper crowdsec: set {config.set} holds the {counts.entries} bans of {config.url}"
        )
        return 0
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"alfwrapper crowdsec: keeping set {config.set} equal to the bans of {config.url}, "
        f"polled every {config.interval:g} s",
        flush=True,
    )
    while not stopping:
        started = time.monotonic()
        counts.polls += 1
        try:
            poll_once(session, config, book, synced, counts)
            if not synced:
                print(
                    f"alfwrapper crowdsec: in step with {config.url}: {counts.entries} entries",
                    flush=True,
                )
            synced = True
            counts.last_success, counts.unstored = time.time(), 0
        except Exception as err:  # noqa: BLE001  (said, then a full resync: never a stop)
            failed(err, counts, synced)
            synced = False
        write_metrics(config.metrics, counts)
        while not stopping and time.monotonic() < started + config.interval:
            time.sleep(min(0.05, config.interval))
    return 0


def failed(err: Exception, counts: Counters, synced: bool) -> None:
    """A poll that failed, counted and said on stderr (the journal): bans the set could
    not take, every poll while they last (every other decision was applied); any other
    failure (a LAPI that cannot be reached) the first time, then every 60th poll."""
    counts.failures += 1
    if not isinstance(err, AlfError):
        err = AlfError(
            "alfwrapper crowdsec",
            f"{type(err).__name__}: {err}",
            "a bug? report it; the next poll resyncs",
        )
    counts.unstored = err.unstored if isinstance(err, sets.NotWhole) else 0
    if counts.unstored or synced or counts.failures == 1 or counts.failures % 60 == 0:
        print(
            f"alfwrapper crowdsec: {err.line().removeprefix('alfwrapper: ')}",
            file=sys.stderr,
            flush=True,
        )


def read_metrics(path: str = METRICS) -> dict[str, Any] | None:
    """The bouncer's counters, for `status --prometheus` (None if it writes none here).
    Root reads what the bouncer's user writes, in that user's folder, so it takes
    only a regular file, whole and small: a link is not followed (it could show root's
    files), a FIFO is not waited on (it held `status` and alfwrapper-metrics.service
    forever), and more than METRICS_LIMIT bytes is nothing."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = b""
        while len(text) <= METRICS_LIMIT:
            chunk = os.read(fd, METRICS_LIMIT + 1 - len(text))
            if not chunk:
                break
            text += chunk
        if len(text) > METRICS_LIMIT:
            return None
        data = json.loads(text)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None
