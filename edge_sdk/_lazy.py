"""The lazy face of a subpackage: its public names, each loaded from its module on first use, so
``import edge_sdk.<package>`` stays light (no runtime, no OpenCV, no HTTP stack) until a name is
used. A face lists ``{name: module}`` once and gets its ``__getattr__`` from here; type checkers
read the same names from the face's ``if TYPE_CHECKING:`` imports."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names[name]`` is the submodule (relative to
    ``package``) that defines ``name``; anything else is an AttributeError naming the package.
    A name is looked up once: its value is then kept in the package's namespace, so later
    reads never come back here."""

    def __getattr__(name: str) -> Any:
        mod = names.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{mod}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
