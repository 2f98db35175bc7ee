"""TOML reading (tomllib / tomli) and a small writer for manifests.

The writer covers what manifests and profiles use: str, int, float, bool,
lists of scalars, nested tables and arrays of tables.  It is not a general
TOML serializer; it raises TypeError for anything else rather than guess.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib as _tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as _tomllib

TOMLDecodeError = _tomllib.TOMLDecodeError


#: Most characters a TOML document may have; manifests and profiles are a few KiB.
MAX_TOML_CHARS = 1 << 20


def loads(text: str, *, max_chars: int = MAX_TOML_CHARS) -> dict[str, Any]:
    """Parse TOML ``text``; every failure is a :class:`TOMLDecodeError`.

    Hostile input is bounded: a document over ``max_chars`` is refused before
    parsing, and nesting deep enough to exhaust Python's recursion limit (the
    stdlib parser recurses per ``[`` / ``{``) is reported as a decode error, not
    a ``RecursionError``.
    """
    if not isinstance(text, str):
        raise TOMLDecodeError(f"expected TOML text (str), got {type(text).__name__}")
    if len(text) > max_chars:
        raise TOMLDecodeError(f"TOML document of {len(text)} characters is over the limit of {max_chars}")
    try:
        doc: dict[str, Any] = _tomllib.loads(text)
        return doc
    except RecursionError:
        raise TOMLDecodeError("TOML arrays/inline tables nested too deeply (expected a flat manifest-style document)") from None


def _key(k: str) -> str:
    if k and all(c.isalnum() or c in "-_" for c in k):
        return k
    return _str(k)


def _str(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise TypeError(f"cannot write non-finite float {v!r} to TOML manifest")
        return repr(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_scalar(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, Mapping) for x in v)


def _emit(table: Mapping[str, Any], prefix: str, lines: list[str]) -> None:
    plain = [(k, v) for k, v in table.items() if v is not None and not isinstance(v, Mapping) and not _is_table_array(v)]
    subtables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    arrays = [(k, v) for k, v in table.items() if _is_table_array(v)]
    for k, v in plain:
        lines.append(f"{_key(k)} = {_scalar(v)}")
    for k, v in subtables:
        name = f"{prefix}{_key(k)}"
        lines.append("")
        lines.append(f"[{name}]")
        _emit(v, name + ".", lines)
    for k, v in arrays:
        name = f"{prefix}{_key(k)}"
        for item in v:
            lines.append("")
            lines.append(f"[[{name}]]")
            _emit(item, name + ".", lines)


def dumps(data: Mapping[str, Any]) -> str:
    """Serialize ``data`` to TOML text (``None`` values are left out)."""
    lines: list[str] = []
    _emit(data, "", lines)
    return "\n".join(lines).lstrip("\n") + "\n"
