"""TOML reading (tomllib / tomli) and a small writer for manifests.

The writer covers what manifests and profiles use: str, int, float, bool,
lists of scalars, nested tables and arrays of tables.  It is not a general
TOML serializer; it raises TypeError for anything else rather than guess.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover - the parser's own class, looked up on first use (see __getattr__)
    if sys.version_info >= (3, 11):
        from tomllib import TOMLDecodeError as TOMLDecodeError
    else:
        from tomli import TOMLDecodeError as TOMLDecodeError


def _parser() -> ModuleType:
    """``tomllib`` (``tomli`` on Python 3.10), imported on the first parse: with ``string`` it costs
    ~5 ms of a cold start, and a warm load reads its manifest and profiles from the cache folder."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    import tomli  # pragma: no cover - exercised on Python 3.10 only

    mod: ModuleType = tomli  # pragma: no cover
    return mod  # pragma: no cover


def __getattr__(name: str) -> Any:
    # ``TOMLDecodeError`` is the parser's own class, looked up on first use (``except _toml.TOMLDecodeError``
    # evaluates it only when an exception is being matched).
    if name == "TOMLDecodeError":
        value = _parser().TOMLDecodeError
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Most characters a TOML document may have; manifests and profiles are a few KiB.
MAX_TOML_CHARS = 1 << 20


def loads(text: str, *, max_chars: int = MAX_TOML_CHARS) -> dict[str, Any]:
    """Parse TOML ``text``; every failure is a :class:`TOMLDecodeError`.

    Hostile input is bounded: a document over ``max_chars`` is refused before
    parsing, and nesting deep enough to exhaust Python's recursion limit (the
    stdlib parser recurses per ``[`` / ``{``) is reported as a decode error, not
    a ``RecursionError``.
    """
    parser = _parser()
    if not isinstance(text, str):
        raise parser.TOMLDecodeError(f"expected TOML text (str), got {type(text).__name__}")
    if len(text) > max_chars:
        raise parser.TOMLDecodeError(f"TOML document of {len(text)} characters is over the limit of {max_chars}")
    try:
        doc: dict[str, Any] = parser.loads(text)
        return doc
    except RecursionError:
        raise parser.TOMLDecodeError("TOML arrays/inline tables nested too deeply (expected a flat manifest-style document)") from None


def cache_root() -> Path:
    """The edge_sdk cache folder: ``$EDGE_SDK_CACHE`` or ``$XDG_CACHE_HOME/edge_sdk`` or ``~/.cache/edge_sdk``
    (here, below every layer that keeps files in it; :func:`edge_sdk.package.default_cache_dir` returns it)."""
    env = os.environ.get("EDGE_SDK_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edge_sdk"


class JsonStore:
    """A small cache file of JSON values by key (a digest), for work a fresh process would otherwise
    redo: parsed TOML documents (manifests, device profiles) and model-file scans.

    The file is ``{"tag": tag, "entries": {key: [json_text, sha256_of_json_text]}}``; a file with
    another ``tag`` (another format or SDK version), or one that does not parse, counts as empty; an
    entry whose text does not match its sha256 or does not parse is not returned. Keys must name the
    input exactly (the sha256 of the bytes the value was computed from), so a changed input is never
    answered from here. Only values that JSON gives back unchanged are kept (``put`` of a tuple, a
    date or a non-finite float is a no-op). Writes replace the file atomically; a read-only folder
    only means the work is done again. The folder is trusted as the sandbox's ``sandbox-ok`` marks
    are: it is the user's own cache. Thread-safe. :meth:`shared` gives one store per file and
    process (the file is read once)."""

    MAX_ENTRIES = 256
    _SHARED: dict[tuple[Path, str], "JsonStore"] = {}
    _SHARED_LOCK = threading.Lock()

    @classmethod
    def shared(cls, path: Path, tag: str) -> "JsonStore":
        """This process's store for ``path`` with ``tag`` (read from the file on first use)."""
        with cls._SHARED_LOCK:
            store = cls._SHARED.get((path, tag))
            if store is None:
                if len(cls._SHARED) >= 8:
                    cls._SHARED.clear()
                store = cls._SHARED[(path, tag)] = cls(path, tag)
            return store

    def __init__(self, path: Path, tag: str) -> None:
        self.path = path
        self.tag = tag
        self.entries: dict[str, Any] = {}
        self.dirty = False
        self._lock = threading.Lock()
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError):
            return  # none yet, unreadable or damaged: rebuilt as values are computed
        if isinstance(data, dict) and data.get("tag") == tag and isinstance(data.get("entries"), dict):
            self.entries = data["entries"]

    def get(self, key: str) -> Any:
        """The value stored under ``key``, or None (none, or a damaged entry)."""
        with self._lock:
            entry = self.entries.get(key)
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], str)):
            return None
        text, check = entry
        if hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() != check:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    def put(self, key: str, value: Any) -> None:
        """Remember ``value`` under ``key`` (written by :meth:`flush`), if JSON gives it back unchanged."""
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            return
        if json.loads(text) != value:
            return
        entry = [text, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()]
        with self._lock:
            if len(self.entries) >= self.MAX_ENTRIES:
                self.entries.clear()
            self.entries[key] = entry
            self.dirty = True

    def flush(self) -> None:
        """Write what :meth:`put` added since the last flush (nothing when nothing was added)."""
        with self._lock:
            if not self.dirty:
                return
            self.dirty = False
            body = json.dumps({"tag": self.tag, "entries": self.entries})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(body, encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only cache: the work is simply done again next time


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
