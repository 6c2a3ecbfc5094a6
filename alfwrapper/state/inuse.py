"""The store in use, as meta and runtime rules reach a socket's pins through it: root's
tree, or the loader's client for a user (store.use_store chooses it, once)."""

from __future__ import annotations

from typing import Protocol

from alfwrapper.state.places import SocketState


class Pins(Protocol):
    """What a socket's meta and runtime rules need of a store: its pins, opened or
    looked for, and the sockets of a service (store.Store, loader.client.Broker)."""

    def open_pin(self, state: SocketState, name: str) -> int: ...

    def has_pin(self, state: SocketState, name: str) -> bool: ...

    def sockets_of(self, service: str) -> list[SocketState]: ...


_in_use: Pins  # root's tree, from the moment store.py is imported (use_pins)


def pins_in_use() -> Pins:
    return _in_use


def use_pins(chosen: Pins) -> None:
    global _in_use
    _in_use = chosen


def open_pin(state: SocketState, name: str) -> int:
    """An fd of one of the socket's pinned objects (from the store in use)."""
    return pins_in_use().open_pin(state, name)
