"""The device profile: the schema (:class:`DeviceProfile` and its tables), loading and validating
a TOML, and the bundled profiles (:func:`load_profile`, :func:`list_profiles`, :func:`profiles_dir`)."""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

from edge_sdk._filestamp import RACY_WINDOW_NS, Stamp, settled, stamp
from edge_sdk._record import frozen
from edge_sdk._toml import JsonStore, cache_root
from edge_sdk._toml import _parser as _toml_parser
from edge_sdk._version import __version__
from edge_sdk.errors import ProfileError

SCHEMA_VERSION = 1
ENV_VAR = "EDGE_SDK_PROFILE"

#: Machine architectures we ship profiles for (``platform.machine()`` normalised).
ARCHES: tuple[str, ...] = ("x86_64", "aarch64")
#: Numeric precisions a runtime preference list may name.
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8", "int4")
#: Runtime backends a preference list may name.
BACKENDS: tuple[str, ...] = ("onnxruntime", "litert")
#: ONNX Runtime graph optimisation levels (ORT_DISABLE_ALL ... ORT_ENABLE_ALL).
GRAPH_OPTIMIZATIONS: tuple[str, ...] = ("disable", "basic", "extended", "all")
#: Power sensor kinds the budget layer knows how to read.
POWER_SENSORS: tuple[str, ...] = ("none", "pi5-pmic", "pi-volts", "ina3221", "rapl", "battery")

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


# --------------------------------------------------------------------------- helpers


def _tuple_of_str(value: Iterable[str] | str, key: str) -> tuple[str, ...]:
    """Coerce a sequence of strings to a tuple, rejecting a bare string (a likely typo)."""
    if isinstance(value, (str, bytes)):
        raise ProfileError(f"{key}: expected a list of strings, got a single string {value!r}")
    try:
        items = tuple(value)
    except TypeError:
        raise ProfileError(f"{key}: expected a list of strings, got {value!r}") from None
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ProfileError(f"{key}: expected non-empty strings, got {item!r} in {list(items)!r}")
    duplicates = sorted({item for item in items if items.count(item) > 1})
    if duplicates:
        raise ProfileError(f"{key}: expected no duplicates, got {duplicates!r} more than once")
    return items


def _check_choices(items: tuple[str, ...], allowed: tuple[str, ...], key: str, *, non_empty: bool) -> None:
    if non_empty and not items:
        raise ProfileError(f"{key}: expected at least one of {list(allowed)}, got []")
    unknown = [item for item in items if item not in allowed]
    if unknown:
        raise ProfileError(f"{key}: expected only values from {list(allowed)}, got unknown {unknown!r}")


def _check_number(value: Any, key: str, *, integer: bool = False) -> float:
    """Return ``value`` as a number, rejecting bools, strings and non-finite floats."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = "an integer" if integer else "a number"
        raise ProfileError(f"{key}: expected {expected}, got {value!r}")
    if not math.isfinite(value):
        raise ProfileError(f"{key}: expected a finite number, got {value!r}")
    return value


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


# --------------------------------------------------------------------------- specs


@frozen
class MatchSpec:
    """How to recognise a board. Every list is optional; any single hit matches.

    * ``device_tree_model``: substrings of ``/proc/device-tree/model`` (compared
      case-insensitively; the longest matching substring is the most specific).
    * ``device_tree_compatible``: exact entries of ``/proc/device-tree/compatible``
      (a NUL-separated list).
    * ``nv_tegra_release``: prefixes of the L4T release, compared with both the
      parsed form (``R36.4.3``) and the line without its leading ``# ``
      (``R36 (release), REVISION: 4.3, ...``).  An L4T release identifies a
      software stack shared by many modules, so it only counts when the
      device tree is unreadable or the profile lists no device-tree patterns.
    """

    device_tree_model: tuple[str, ...] = ()
    device_tree_compatible: tuple[str, ...] = ()
    nv_tegra_release: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("device_tree_model", "device_tree_compatible", "nv_tegra_release"):
            _set(self, name, _tuple_of_str(getattr(self, name), f"match.{name}"))

    @property
    def is_empty(self) -> bool:
        """True when no pattern is given (generic profiles)."""
        return not (self.device_tree_model or self.device_tree_compatible or self.nv_tegra_release)


@frozen
class RuntimeSpec:
    """How to run models on the board.

    * ``precisions``: preference order, a subset of :data:`PRECISIONS`.
    * ``backends``: preference order, a subset of :data:`BACKENDS`.
    * ``onnxruntime_providers``: ONNX Runtime execution providers in order.
    * ``litert_delegates``: delegate shared-library names to try in order;
      ``()`` means the built-in CPU/XNNPACK path only.  A delegate that fails
      to load is skipped by the backend, never fatal.
    * ``threads``: intra-op threads, >= 1.
    * ``allow_spinning``: ONNX Runtime intra-op spin-wait (burns CPU between runs).
    * ``graph_optimization``: one of :data:`GRAPH_OPTIMIZATIONS`.
    * ``memory_budget_mb``: cap on model working memory, MiB, >= 1.
    * ``memory_budget_fraction``: fraction of MemTotal in (0, 1]; the effective
      budget is ``min(memory_budget_mb, fraction * MemTotal)``
      (see :func:`effective_memory_budget_mb`).
    """

    precisions: tuple[str, ...]
    backends: tuple[str, ...]
    onnxruntime_providers: tuple[str, ...]
    litert_delegates: tuple[str, ...]
    threads: int
    allow_spinning: bool
    graph_optimization: str
    memory_budget_mb: int
    memory_budget_fraction: float

    def __post_init__(self) -> None:
        _set(self, "precisions", _tuple_of_str(self.precisions, "runtime.precisions"))
        _check_choices(self.precisions, PRECISIONS, "runtime.precisions", non_empty=True)
        _set(self, "backends", _tuple_of_str(self.backends, "runtime.backends"))
        _check_choices(self.backends, BACKENDS, "runtime.backends", non_empty=True)
        providers = _tuple_of_str(self.onnxruntime_providers, "runtime.onnxruntime_providers")
        bad = [p for p in providers if not p.endswith("ExecutionProvider")]
        if bad:
            raise ProfileError(
                "runtime.onnxruntime_providers: expected ONNX Runtime provider names ending in "
                f"'ExecutionProvider' (e.g. 'CPUExecutionProvider'), got {bad!r}"
            )
        if "onnxruntime" in self.backends and not providers:
            raise ProfileError(
                "runtime.onnxruntime_providers: expected at least one provider because "
                "runtime.backends includes 'onnxruntime', got []"
            )
        _set(self, "onnxruntime_providers", providers)
        _set(self, "litert_delegates", _tuple_of_str(self.litert_delegates, "runtime.litert_delegates"))
        threads = _check_number(self.threads, "runtime.threads", integer=True)
        if threads < 1:
            raise ProfileError(f"runtime.threads: expected an integer >= 1, got {threads!r}")
        if not isinstance(self.allow_spinning, bool):
            raise ProfileError(f"runtime.allow_spinning: expected true or false, got {self.allow_spinning!r}")
        if self.graph_optimization not in GRAPH_OPTIMIZATIONS:
            raise ProfileError(
                f"runtime.graph_optimization: expected one of {list(GRAPH_OPTIMIZATIONS)}, "
                f"got {self.graph_optimization!r}"
            )
        cap = _check_number(self.memory_budget_mb, "runtime.memory_budget_mb", integer=True)
        if cap < 1:
            raise ProfileError(f"runtime.memory_budget_mb: expected an integer >= 1 (MiB), got {cap!r}")
        fraction = float(_check_number(self.memory_budget_fraction, "runtime.memory_budget_fraction"))
        if not 0.0 < fraction <= 1.0:
            raise ProfileError(
                f"runtime.memory_budget_fraction: expected a number in (0, 1], got {self.memory_budget_fraction!r}"
            )
        _set(self, "memory_budget_fraction", fraction)


@frozen
class ThermalSpec:
    """Thermal zones to watch and our limits, in degrees Celsius.

    * ``zones``: ``thermal_zone*/type`` names to watch; ``()`` means all zones.
    * ``vendor_throttle_c``: where the vendor's firmware/kernel starts throttling.
    * ``warn_c``: where we start degrading (ours).
    * ``critical_c``: where we degrade hard (ours).

    Invariant: ``warn_c < critical_c < vendor_throttle_c`` so we always act
    before the firmware takes the clocks away.
    """

    zones: tuple[str, ...]
    vendor_throttle_c: float
    warn_c: float
    critical_c: float

    def __post_init__(self) -> None:
        _set(self, "zones", _tuple_of_str(self.zones, "thermal.zones"))
        for name in ("vendor_throttle_c", "warn_c", "critical_c"):
            value = float(_check_number(getattr(self, name), f"thermal.{name}"))
            if not 0.0 < value <= 150.0:
                raise ProfileError(f"thermal.{name}: expected degrees Celsius in (0, 150], got {value!r}")
            _set(self, name, value)
        if not self.warn_c < self.critical_c:
            raise ProfileError(
                f"thermal.warn_c: expected warn_c < critical_c ({self.critical_c}), got {self.warn_c}"
            )
        if not self.critical_c < self.vendor_throttle_c:
            raise ProfileError(
                "thermal.critical_c: expected critical_c < vendor_throttle_c "
                f"({self.vendor_throttle_c}), got {self.critical_c}"
            )


@frozen
class PowerSpec:
    """Power sensor and budget.

    * ``sensor``: one of :data:`POWER_SENSORS`.
    * ``budget_w``: board power budget in watts; ``0.0`` means no budget is
      known and only observation is possible.
    * ``rails``: rail names to sum or watch; ``()`` means the sensor's own
      default (all rails it reports, labels read at runtime).
    """

    sensor: str
    budget_w: float
    rails: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.sensor not in POWER_SENSORS:
            raise ProfileError(f"power.sensor: expected one of {list(POWER_SENSORS)}, got {self.sensor!r}")
        budget = float(_check_number(self.budget_w, "power.budget_w"))
        if budget < 0.0:
            raise ProfileError(f"power.budget_w: expected watts >= 0 (0 = unknown), got {self.budget_w!r}")
        _set(self, "budget_w", budget)
        _set(self, "rails", _tuple_of_str(self.rails, "power.rails"))
        if self.sensor == "none" and self.rails:
            raise ProfileError(f"power.rails: expected [] when power.sensor is 'none', got {list(self.rails)!r}")


@frozen
class DeviceProfile:
    """One device profile. Immutable and validated on construction.

    ``name`` is the file stem (``raspberry-pi-5``); generic profiles are named
    ``generic-<arch>``, have ``generic=True`` and no match patterns (they are
    chosen by architecture when nothing else matches).  ``path`` is the file
    it was loaded from, or ``None`` for a profile built in code.
    """

    name: str
    display_name: str
    arch: str
    generic: bool
    match: MatchSpec
    runtime: RuntimeSpec
    thermal: ThermalSpec
    power: PowerSpec
    camera_source: str
    sources: tuple[str, ...] = ()
    path: Path | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ProfileError(f"name: expected lower-case letters, digits, '-' and '_', got {self.name!r}")
        if not isinstance(self.display_name, str) or not self.display_name.strip():
            raise ProfileError(f"display_name: expected a non-empty string, got {self.display_name!r}")
        if self.arch not in ARCHES:
            raise ProfileError(f"arch: expected one of {list(ARCHES)}, got {self.arch!r}")
        if not isinstance(self.generic, bool):
            raise ProfileError(f"generic: expected true or false, got {self.generic!r}")
        parts = (("match", MatchSpec), ("runtime", RuntimeSpec), ("thermal", ThermalSpec), ("power", PowerSpec))
        for name, kind in parts:
            if not isinstance(getattr(self, name), kind):
                raise ProfileError(f"{name}: expected a {kind.__name__}, got {type(getattr(self, name)).__name__}")
        if self.generic:
            if self.name != f"generic-{self.arch}":
                raise ProfileError(f"name: expected 'generic-{self.arch}' for a generic profile, got {self.name!r}")
            if not self.match.is_empty:
                raise ProfileError("match: expected no patterns for a generic profile (they are chosen by arch)")
        else:
            if self.name.startswith("generic-"):
                raise ProfileError(f"generic: expected true for a profile named {self.name!r}, got false")
            if self.match.is_empty:
                raise ProfileError(
                    "match: expected at least one device_tree_model, device_tree_compatible or "
                    "nv_tegra_release pattern for a non-generic profile, got none"
                )
        if not isinstance(self.camera_source, str) or "://" not in self.camera_source:
            raise ProfileError(
                f"camera.default_source: expected a source URI such as 'csi://0', got {self.camera_source!r}"
            )
        _set(self, "sources", _tuple_of_str(self.sources, "sources"))
        if self.path is not None:
            _set(self, "path", Path(self.path))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict in the TOML layout (lists, not tuples)."""
        return {
            "schema": SCHEMA_VERSION,
            "name": self.name,
            "display_name": self.display_name,
            "arch": self.arch,
            "generic": self.generic,
            "sources": list(self.sources),
            "match": {
                "device_tree_model": list(self.match.device_tree_model),
                "device_tree_compatible": list(self.match.device_tree_compatible),
                "nv_tegra_release": list(self.match.nv_tegra_release),
            },
            "runtime": {
                "precisions": list(self.runtime.precisions),
                "backends": list(self.runtime.backends),
                "onnxruntime_providers": list(self.runtime.onnxruntime_providers),
                "litert_delegates": list(self.runtime.litert_delegates),
                "threads": self.runtime.threads,
                "allow_spinning": self.runtime.allow_spinning,
                "graph_optimization": self.runtime.graph_optimization,
                "memory_budget_mb": self.runtime.memory_budget_mb,
                "memory_budget_fraction": self.runtime.memory_budget_fraction,
            },
            "thermal": {
                "zones": list(self.thermal.zones),
                "vendor_throttle_c": self.thermal.vendor_throttle_c,
                "warn_c": self.thermal.warn_c,
                "critical_c": self.thermal.critical_c,
            },
            "power": {
                "sensor": self.power.sensor,
                "budget_w": self.power.budget_w,
                "rails": list(self.power.rails),
            },
            "camera": {"default_source": self.camera_source},
            "path": None if self.path is None else str(self.path),
        }


# --------------------------------------------------------------------------- loading

_TOP_KEYS = {
    "schema", "name", "display_name", "arch", "generic", "sources", "match", "runtime", "thermal", "power", "camera",
}
_TABLE_KEYS = {
    "match": {"device_tree_model", "device_tree_compatible", "nv_tegra_release"},
    "runtime": {
        "precisions",
        "backends",
        "onnxruntime_providers",
        "litert_delegates",
        "threads",
        "allow_spinning",
        "graph_optimization",
        "memory_budget_mb",
        "memory_budget_fraction",
    },
    "thermal": {"zones", "vendor_throttle_c", "warn_c", "critical_c"},
    "power": {"sensor", "budget_w", "rails"},
    "camera": {"default_source"},
}


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    prefix = f"{where}." if where else ""
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ProfileError(
            f"unknown key(s) {[prefix + k for k in unknown]}: expected only {sorted(prefix + k for k in allowed)}"
        )
    missing = sorted(allowed - set(table))
    if missing:
        raise ProfileError(f"missing key(s) {[prefix + k for k in missing]}")


def _table(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = doc[name]
    if not isinstance(value, dict):
        raise ProfileError(f"{name}: expected a table [{name}], got {value!r}")
    _check_keys(value, _TABLE_KEYS[name], name)
    return value


def _profile_from_document(doc: Mapping[str, Any], path: Path | None) -> DeviceProfile:
    _check_keys(doc, _TOP_KEYS, "")
    schema = doc["schema"]
    if isinstance(schema, bool) or schema != SCHEMA_VERSION:
        raise ProfileError(f"schema: expected {SCHEMA_VERSION}, got {schema!r}")
    for key in ("name", "display_name", "arch"):
        if not isinstance(doc[key], str):
            raise ProfileError(f"{key}: expected a string, got {doc[key]!r}")
    if path is not None and doc["name"] != path.stem:
        raise ProfileError(f"name: expected the file stem {path.stem!r}, got {doc['name']!r}")
    match, runtime, thermal, power, camera = (
        _table(doc, n) for n in ("match", "runtime", "thermal", "power", "camera")
    )
    if not isinstance(camera["default_source"], str):
        raise ProfileError(f"camera.default_source: expected a string, got {camera['default_source']!r}")
    if not isinstance(runtime["graph_optimization"], str):
        raise ProfileError(f"runtime.graph_optimization: expected a string, got {runtime['graph_optimization']!r}")
    if not isinstance(power["sensor"], str):
        raise ProfileError(f"power.sensor: expected a string, got {power['sensor']!r}")
    return DeviceProfile(
        name=doc["name"],
        display_name=doc["display_name"],
        arch=doc["arch"],
        generic=doc["generic"],
        match=MatchSpec(**match),
        runtime=RuntimeSpec(**runtime),
        thermal=ThermalSpec(**thermal),
        power=PowerSpec(**power),
        camera_source=camera["default_source"],
        sources=doc["sources"],
        path=path,
    )


#: Parsed profiles by the file's (path, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): a warm process
#: loading a model again does not re-parse the 15 bundled TOMLs (26 ms on Zen 3). Profiles are frozen, so
#: one object can be shared; a file changed since is parsed again, one changed within the racy window is not
#: remembered (:mod:`edge_sdk._filestamp`).
_PARSED: dict[tuple[str, Stamp], DeviceProfile] = {}
_PARSED_MAX = 256
_RACY_NS = RACY_WINDOW_NS
_PARSED_LOCK = threading.Lock()


#: The parsed-document cache across processes: ``<cache>/`` this file name (:class:`edge_sdk._toml.JsonStore`,
#: by the sha256 of each file's bytes). A fresh process otherwise parses every bundled TOML to detect
#: its board (~20 ms for 15 profiles, tomllib's import included). Only the TOML parse is skipped: the
#: profile is built and validated from the document every time, so its values and errors are those of
#: a fresh parse (a cached document that fails validation is not trusted: the file is parsed again).
DOC_CACHE_NAME = "profile-docs.json"
_DOC_CACHE_TAG = f"profile-docs 1, edge_sdk {__version__}"


def _doc_cache() -> JsonStore:
    return JsonStore.shared(cache_root() / DOC_CACHE_NAME, _DOC_CACHE_TAG)


def _from_bytes(path: Path, raw: bytes) -> DeviceProfile:
    """The profile in file ``path`` whose bytes are ``raw``: from its document in the cache when that
    validates, else parsed (``tomllib.load``'s UTF-8 then TOML) and remembered."""
    docs = _doc_cache()
    digest = hashlib.sha256(raw).hexdigest()
    doc = docs.get(digest)
    if isinstance(doc, dict):
        try:
            return _profile_from_document(doc, path)
        except ProfileError:
            pass  # a cached document is not trusted to be wrong: the bytes decide
    try:
        doc = _toml_parser().loads(raw.decode())
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError; so is UnicodeDecodeError, raised as tomllib.load raises it
        if isinstance(exc, _toml_parser().TOMLDecodeError):
            raise ProfileError(f"{path}: not valid TOML: {exc}") from exc
        raise
    docs.put(digest, doc)
    try:
        return _profile_from_document(doc, path)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def _load_file(path: Path) -> DeviceProfile:
    try:
        with path.open("rb") as fh:
            st = os.fstat(fh.fileno())
            key = (str(path), stamp(st))
            with _PARSED_LOCK:
                hit = _PARSED.get(key)
            if hit is not None:
                return hit
            started = time.time_ns()
            raw = fh.read()
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc}") from exc
    prof = _from_bytes(path, raw)
    if settled(st, started, _RACY_NS):
        with _PARSED_LOCK:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[key] = prof
    return prof


_RESOLVED: dict[str, Path] = {}  # this module's path, resolved once (resolve() costs several syscalls)


def profiles_dir() -> Path:
    """Directory of the bundled profiles.

    An installed wheel carries them in ``edge_sdk/_profiles/`` (the build
    force-includes ``device_profiles/`` there); a checkout or editable install
    uses ``<repo>/device_profiles``.  The packaged location is checked first.
    The returned directory may not exist if the installation is broken;
    :func:`list_profiles` reports that.
    """
    here = _RESOLVED.get(__file__)
    if here is None:
        here = _RESOLVED[__file__] = Path(__file__).resolve()
    packaged = here.parents[1] / "_profiles"
    if packaged.is_dir():
        return packaged
    return here.parents[2] / "device_profiles"


def list_profiles() -> list[str]:
    """Names of the bundled profiles, sorted. Raises ProfileError if none are installed."""
    directory = profiles_dir()
    names = sorted(p.stem for p in directory.glob("*.toml")) if directory.is_dir() else []
    if not names:
        raise ProfileError(f"no bundled device profiles found in {directory} (is edge_sdk installed correctly?)")
    return names


def looks_like_path(value: str) -> bool:
    """True if ``value`` names a file (has a separator or ends in .toml) rather than a bundled profile."""
    return value.endswith(".toml") or "/" in value or os.sep in value


def load_profile(name_or_path: Union[str, os.PathLike[str]]) -> DeviceProfile:
    """Load a bundled profile by name (``"raspberry-pi-5"``) or any profile file by path.

    A string is taken as a path when it ends in ``.toml`` or contains a path
    separator; an ``os.PathLike`` is always a path.  Raises ProfileError for an
    unknown name (listing the known ones), a missing or unreadable file, bad
    TOML, an unknown or missing key, or an invalid value (naming the file and key).
    """
    if isinstance(name_or_path, os.PathLike) or (isinstance(name_or_path, str) and looks_like_path(name_or_path)):
        try:
            return _load_file(Path(name_or_path))
        finally:
            _doc_cache().flush()
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ProfileError(f"expected a profile name or a path to a .toml file, got {name_or_path!r}")
    known = list_profiles()
    if name_or_path not in known:
        raise ProfileError(f"unknown device profile {name_or_path!r}; known profiles: {', '.join(known)}")
    try:
        return _load_file(profiles_dir() / f"{name_or_path}.toml")
    finally:
        _doc_cache().flush()


def bundled_profiles() -> list[DeviceProfile]:
    """Every bundled profile, loaded (sorted by name)."""
    directory = profiles_dir()
    try:
        return [_load_file(directory / f"{name}.toml") for name in list_profiles()]
    finally:
        _doc_cache().flush()
