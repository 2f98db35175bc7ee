"""One event-callback list for every object that reports events (governor, router, model
telemetry, quality monitor, shadow checker): ``add`` returns the unsubscribe function, ``emit``
calls each callback in order and logs, never raises, what a callback raises."""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

from ._log import get_logger
from .errors import OptionsTypeError

E = TypeVar("E")
_log = get_logger("edge_sdk")


class Listeners(Generic[E]):
    """Callbacks for the events of ``owner`` (named in the log line when one raises)."""

    __slots__ = ("_callbacks", "_owner")

    def __init__(self, owner: str) -> None:
        self._callbacks: list[Callable[[E], Any]] = []
        self._owner = owner

    def add(self, callback: Callable[[E], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` on every event from now on; returns a function that removes it."""
        if not callable(callback):
            raise OptionsTypeError(f"callback: expected a callable, got {type(callback).__name__}")
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def emit(self, event: E) -> None:
        """Call every callback with ``event``, in the order added, on this thread."""
        for cb in list(self._callbacks):
            try:
                cb(event)
            except Exception:
                _log.exception("%s: an event listener raised (ignored)", self._owner)

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def __len__(self) -> int:
        return len(self._callbacks)
