"""gc: the state of sockets that are gone, and knock state no socket names, removed.

Socket cookies are unique until reboot, and sock_diag lists every bound socket of a
namespace: a socket it does not list, whose process (the wrapper that pinned it, then
the application) is gone too, is gone.  A gc holds a service's folder exclusively
(lock.service_lock) while it judges the sockets there.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from alfwrapper.errors import AlfError
from alfwrapper.state.inuse import Pins
from alfwrapper.state.liveness import alive, live_cookies, live_everywhere, netns_cookie
from alfwrapper.state.lock import service_lock
from alfwrapper.state.meta import read_meta
from alfwrapper.state.places import SocketState, is_service_folder, service_of
from alfwrapper.state.runtime import holds_runtime_rules

Meta = dict[str, object]


class Tree(Pins, Protocol):
    """What a gc needs of a tree (store.Store)."""

    def root(self, create: bool = True) -> Path: ...

    def state(self, service: str, cookie: int) -> SocketState: ...

    def remove(self, state: SocketState) -> None: ...


def gc_here(tree: Tree) -> list[SocketState]:
    """Remove the state of sockets of this network namespace that no longer exist.
    State from other namespaces is left to `alfwrapper gc` (gc_everywhere)."""
    settled = socket_folders(tree)
    # Asked only if some socket's process is gone (a dump of every socket).
    return collect_tree(tree, settled, functools.cache(live_cookies), {netns_cookie()})


def gc_everywhere(trees: list[Tree]) -> list[SocketState]:
    """As root: gc over every network namespace we can find (processes' and /run/netns),
    in these trees (root's and every user's); an OSError where we may not enter them.

    The state of a socket whose namespace we cannot find (a namespace no process is
    in, held only by a socket unit, or one deleted) is kept: it cannot be told
    from alive.
    """
    settled = {p for tree in trees for p in socket_folders(tree)}
    live, seen = live_everywhere()
    removed = []
    for tree in trees:
        removed += collect_tree(tree, settled, lambda: live, seen)
    return removed


def socket_folders(tree: Tree) -> set[Path]:
    """The socket folders there are now: a gc lists them before it asks which
    sockets live, and judges only these.  A socket made after that question is
    alive whatever its meta says, and a meta may say nothing (damaged)."""
    try:
        root = tree.root(create=False)
        return {p for d in root.iterdir() if is_service_folder(d) for p in d.glob("sock-*")}
    except (AlfError, OSError):
        return set()


def collect_tree(
    tree: Tree, settled: set[Path], live: Callable[[], set[int]], namespaces: set[int] | None
) -> list[SocketState]:
    """Remove the state of the ``settled`` sockets whose cookie is not alive (``live()``,
    asked after ``settled`` was listed; only from these namespaces, if given), and
    knock state no socket refers to any more."""
    try:
        root = tree.root(create=False)
    except AlfError:
        return []
    removed = []
    for service_dir in sorted(p for p in root.iterdir() if is_service_folder(p)):
        with service_lock(service_dir, exclusive=True) as alone:
            removed += _collect_service(tree, service_dir, settled, live, namespaces, alone)
    return removed


def _collect_service(
    tree: Tree,
    service_dir: Path,
    settled: set[Path],
    live: Callable[[], set[int]],
    namespaces: set[int] | None,
    alone: bool,
) -> list[SocketState]:
    """One service's folder.  Unless ``alone`` (no start is making state in it), state
    without meta is a start's in progress, and the folder stays."""
    try:
        entries = sorted(service_dir.iterdir())
    except FileNotFoundError:
        return []  # removed by another gc
    gone, staying, kept_knock = _judge_sockets(
        tree, service_dir, entries, settled, live, namespaces, alone
    )
    removed = _remove_gone(tree, gone, staying)
    _remove_knock_state(entries, kept_knock)
    if alone:
        try:
            service_dir.rmdir()  # if empty
        except OSError:
            pass  # not empty, or removed by another gc
    return removed


def _judge_sockets(
    tree: Tree,
    service_dir: Path,
    entries: list[Path],
    settled: set[Path],
    live: Callable[[], set[int]],
    namespaces: set[int] | None,
    alone: bool,
) -> tuple[list[tuple[SocketState, Meta]], set[object], set[str]]:
    """The sockets of the folder that are gone (with their meta), the names of those that
    stay, and the knock folders to keep ("*": every one)."""
    gone: list[tuple[SocketState, Meta]] = []
    staying: set[object] = set()  # the names of the sockets that stay
    kept_knock: set[str] = set()
    for entry in entries:
        if not entry.name.startswith("sock-") or not entry.name[5:].isdigit():
            continue
        if entry not in settled:  # made after the gc asked which sockets live
            kept_knock.add("*")
            continue
        where = tree.state(service_of(service_dir.name), int(entry.name[5:]))
        meta = _meta_of(where, entry)
        if not meta and not alone:
            kept_knock.add("*")  # a start's in progress: its knock state too
            continue
        known = namespaces is None or meta.get("netns") in namespaces or not meta
        owner_alive = alive(meta.get("pid"))  # its process: the socket may be unbound
        if known and not owner_alive and where.cookie not in live():
            gone.append((where, meta))
            continue
        staying.add(meta.get("name"))
        kept_knock |= _knock_kept(meta)
    return gone, staying, kept_knock


def _meta_of(where: SocketState, entry: Path) -> Meta:
    """A socket's meta, or {} if it has none (a start's in progress, or damaged)."""
    try:
        return read_meta(where) if (entry / "meta").exists() else {}
    except AlfError:
        if (entry / "meta").exists():
            raise
        return {}  # removed meanwhile, by another gc


def _knock_kept(meta: Meta) -> set[str]:
    """The knock folders a socket that stays keeps."""
    kept: set[str] = set()
    if "knock" in meta:  # its knock folders (or one, as a string)
        named = meta["knock"]
        kept.update(map(str, named) if isinstance(named, list) else [str(named)])
    elif meta.get("pid") != os.getpid():
        # Another process's start in progress: its knock state may be pinned
        # and not named yet.  (This process's own is named once it runs.)
        kept.add("*")
    return kept


def _remove_gone(
    tree: Tree, gone: list[tuple[SocketState, Meta]], staying: set[object]
) -> list[SocketState]:
    removed = []
    for where, meta in gone:
        # A gone socket's runtime rules stay until a socket of its name holds them
        # (inherit_runtime): a restart that makes new sockets keeps every ban.
        # (One that was never named, a start's killed before its meta, was given
        # its rules by the sockets that keep them.)
        name = meta.get("name")
        if name is not None and name not in staying and holds_runtime_rules(where, tree):
            continue
        tree.remove(where)
        removed.append(where)
    return removed


def _remove_knock_state(entries: list[Path], kept_knock: set[str]) -> None:
    """The service's knock folders no socket keeps."""
    for knock in entries:
        if not knock.name.startswith("knock-") or knock.name in kept_knock or "*" in kept_knock:
            continue
        if knock.is_dir():
            shutil.rmtree(knock, ignore_errors=True)
        else:  # a pin where a knock folder would be: nothing of ours
            knock.unlink(missing_ok=True)
