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

import gc
import json
import os
import signal
import sys
import time
import tomllib
from typing import Any

from alfwrapper import sets
from alfwrapper.errors import EX_CONFIG, EX_PROTOCOL, AlfError, excerpt
from alfwrapper.policy.crowdsec import Book, load_answer, read_answer
from alfwrapper.policy.inputs import read_input
from alfwrapper.policy.rules import SET_NAME_RULE, valid_set_name
from alfwrapper.record import Record, as_dict, field

CONFIG = "/etc/alfwrapper/crowdsec.toml"
METRICS = "/run/alfwrapper-crowdsec/metrics.json"
CONFIG_LIMIT = 64 << 10
KEY_LIMIT = 4096
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
             "metrics-file"}  # fmt: skip
    unknown = sorted(set(data) - known)
    if unknown:
        raise bad(f"has an unknown key {unknown[0]!r}", f"the keys: {', '.join(sorted(known))}")
    url = data.get("lapi-url", Config.url)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 512:
        raise bad(f"lapi-url {excerpt(str(url))} is not an http(s) URL",
                  "give the LAPI's URL, e.g. http://127.0.0.1:8080/")  # fmt: skip
    given = key_file or data.get("api-key-file")
    if not isinstance(given, str):
        raise bad("has no api-key-file", "name the file holding `cscli bouncers add`'s key")
    key = ""
    if need_key:
        raw = read_input(given, "crowdsec api-key-file", KEY_LIMIT)
        key = raw.decode("ascii", "replace").strip()
        if not key or not key.isprintable() or not key.isascii():
            raise bad(f"{given} holds no key",
                      "write the key `cscli bouncers add NAME -o raw` gave")  # fmt: skip
    name = data.get("set", Config.set)
    if not valid_set_name(name):
        raise bad(f"set {excerpt(str(name))} is not a set name", SET_NAME_RULE)
    scopes = data.get("scopes", list(SCOPES))
    if not isinstance(scopes, list) or not scopes or not set(map(str, scopes)) <= set(SCOPES):
        raise bad(f"scopes {excerpt(str(scopes))} are not a list of ip and range",
                  'write scopes = ["ip", "range"]')  # fmt: skip
    numbers = {}
    for option, default, low, high in (("poll-interval", Config.interval, 0.1, 3600.0),
                                       ("timeout", Config.timeout, 1.0, 600.0)):  # fmt: skip
        value = data.get(option, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (low <= value <= high)
        ):
            raise bad(f"{option} {excerpt(str(value))} is out of range",
                      f"give {low:g} to {high:g} seconds")  # fmt: skip
        numbers[option] = float(value)
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
        now = _apply(parsed, config, book, synced, counts)
        counts.apply_seconds = time.monotonic() - arrived
        # What the set need not wait for: the book's heap of expiries (networks
        # settles it), and freeing the answer's objects (parsed, when this returns).
        counts.entries = book.networks(now)
    finally:
        gc.enable()


def _apply(parsed: Any, config: Config, book: Book, synced: bool, counts: Counters) -> int:
    """Apply an answer to the book and the set; the time it read it at."""
    now = sets.now_ns()
    answer = read_answer(parsed, now)
    counts.skipped += answer.skipped
    counts.malformed += answer.malformed
    sets.sweep(config.set, ("ranges",))  # lapsed ranges hide those they are nested in
    if synced:
        changes = book.delta(answer, now)
        if changes.remove:
            counts.removed += sets.delete(config.set, sorted(changes.remove))
        if changes.hold:
            sets.hold(config.set, changes.hold)
            counts.added += len(changes.hold)
    else:
        hold = book.snapshot(answer, now)
        counts.removed += sets.assign(config.set, hold)
        counts.added += len(hold)
        counts.resyncs += 1
    return now


def write_metrics(path: str, counts: Counters) -> None:
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return
    temp = f"{path}.{os.getpid()}"
    try:
        with open(temp, "w", encoding="utf-8") as f:  # noqa: PTH123
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
    session.headers.update({"X-Api-Key": config.key, "User-Agent": "alfwrapper-crowdsec",
                            "Accept-Encoding": "identity"})  # fmt: skip
    book, synced, counts = Book.empty(), False, Counters()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    if once:
        poll_once(session, config, book, False, counts)
        print(f"alfwrapper crowdsec: set {config.set} holds the {counts.entries} bans of "
              f"{config.url}")  # fmt: skip
        return 0
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"alfwrapper crowdsec: keeping set {config.set} equal to the bans of {config.url}, "
          f"polled every {config.interval:g} s", flush=True)  # fmt: skip
    while not stopping:
        started = time.monotonic()
        counts.polls += 1
        try:
            poll_once(session, config, book, synced, counts)
            if not synced:
                print(f"alfwrapper crowdsec: in step with {config.url}: {counts.entries} "
                      f"entries", flush=True)  # fmt: skip
            synced = True
            counts.last_success = time.time()
        except Exception as err:  # noqa: BLE001  (said, then a full resync: never a stop)
            counts.failures += 1
            if not isinstance(err, AlfError):
                err = AlfError("alfwrapper crowdsec", f"{type(err).__name__}: {err}",
                               "a bug? report it; the next poll resyncs")  # fmt: skip
            if synced or counts.failures == 1 or counts.failures % 60 == 0:
                print(f"alfwrapper crowdsec: {err.line().removeprefix('alfwrapper: ')}",
                      file=sys.stderr, flush=True)  # fmt: skip
            synced = False
        write_metrics(config.metrics, counts)
        while not stopping and time.monotonic() < started + config.interval:
            time.sleep(min(0.05, config.interval))
    return 0


def read_metrics(path: str = METRICS) -> dict[str, Any] | None:
    """The bouncer's counters, for `status --prometheus` (None if it writes none here)."""
    try:
        with open(path, encoding="utf-8") as f:  # noqa: PTH123
            data = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
