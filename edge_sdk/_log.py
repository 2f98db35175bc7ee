"""Loggers made on first use.

``import logging`` (with ``traceback``, ``string`` and ``weakref`` behind it) costs a cold start about
4 ms, and the SDK logs only when something goes wrong (a listener or collector that raised, a write
that failed). ``get_logger(name)`` returns a stand-in that imports :mod:`logging` and calls
``logging.getLogger(name)`` the first time one of its methods is used, then behaves as that logger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import logging

__all__ = ["get_logger"]


class _LazyLogger:
    __slots__ = ("_name", "_logger")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        lg = self._logger
        if lg is None:
            import logging

            lg = self._logger = logging.getLogger(self._name)
        return getattr(lg, attr)

    def __repr__(self) -> str:
        return f"<lazy logger {self._name!r}>"


def get_logger(name: str) -> "logging.Logger":
    """``logging.getLogger(name)``, made when first used."""
    return _LazyLogger(name)  # type: ignore[return-value]  # it forwards every attribute to the logger
