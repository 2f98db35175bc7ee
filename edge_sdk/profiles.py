"""Device profiles: what a board is, how to recognise it, and how to run on it.

A *device profile* is a small TOML file (``device_profiles/<name>.toml``, shipped
in the wheel as ``edge_sdk/_profiles/<name>.toml``) that says how to recognise a
board (device-tree model / compatible strings, the ``/etc/nv_tegra_release``
line), which precisions, runtimes, providers and delegates to prefer, how many
threads and how much memory to use, which thermal zones to watch and where we
start degrading (always below the vendor's own throttle point), which power
sensor and budget apply, and the default camera source.

Everything here is pure: nothing is probed at import time.  Hardware facts are
read from a configurable root (``read_facts(root)``) so tests can point at a
recorded fake ``/proc`` and ``/sys`` tree.

Typical use::

    from edge_sdk.profiles import resolve_profile

    det = resolve_profile()            # EDGE_SDK_PROFILE, else detect()
    print(det.explain())
    det.profile.runtime.precisions     # e.g. ('int8', 'fp16', 'fp32')
    det.memory_budget_mb               # effective budget in MiB

Units: temperatures in degrees Celsius (``*_c``), power in watts (``*_w``),
memory in MiB (``*_mb``; 1 MiB = 1024 KiB, as ``/proc/meminfo`` counts).
"""

from __future__ import annotations

import math
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from edge_sdk.errors import ProfileError

__all__ = [
    "ARCHES",
    "BACKENDS",
    "DETECTION_SOURCES",
    "ENV_VAR",
    "GRAPH_OPTIMIZATIONS",
    "POWER_SENSORS",
    "PRECISIONS",
    "SCHEMA_VERSION",
    "BoardMatch",
    "DeviceProfile",
    "HardwareFacts",
    "MatchSpec",
    "PowerSpec",
    "RuntimeSpec",
    "ThermalSpec",
    "detect",
    "effective_memory_budget_mb",
    "list_profiles",
    "load_profile",
    "profiles_dir",
    "read_facts",
    "resolve_profile",
]

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
#: Values of :attr:`BoardMatch.source`.
DETECTION_SOURCES: tuple[str, ...] = ("override-arg", "override-env", "detected", "fallback")

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_RELEASE_RE = re.compile(r"^#?\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9][0-9.]*)")
_MACHINE_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}

# Arm MIDR implementer 0x41 part numbers -> core names (Linux arch/arm64/include/asm/cputype.h).
_ARM_PARTS = {
    "0xd03": "Cortex-A53",
    "0xd04": "Cortex-A35",
    "0xd05": "Cortex-A55",
    "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72",
    "0xd09": "Cortex-A73",
    "0xd0a": "Cortex-A75",
    "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1",
    "0xd0d": "Cortex-A77",
    "0xd40": "Neoverse-V1",
    "0xd41": "Cortex-A78",
    "0xd42": "Cortex-A78AE",
    "0xd44": "Cortex-X1",
    "0xd46": "Cortex-A510",
    "0xd47": "Cortex-A710",
    "0xd48": "Cortex-X2",
    "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2",
}


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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


def _load_file(path: Path) -> DeviceProfile:
    try:
        with path.open("rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc}") from exc
    try:
        return _profile_from_document(doc, path)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def profiles_dir() -> Path:
    """Directory of the bundled profiles.

    An installed wheel carries them in ``edge_sdk/_profiles/`` (the build
    force-includes ``device_profiles/`` there); a checkout or editable install
    uses ``<repo>/device_profiles``.  The packaged location is checked first.
    The returned directory may not exist if the installation is broken;
    :func:`list_profiles` reports that.
    """
    packaged = Path(__file__).resolve().parent / "_profiles"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[1] / "device_profiles"


def list_profiles() -> list[str]:
    """Names of the bundled profiles, sorted. Raises ProfileError if none are installed."""
    directory = profiles_dir()
    names = sorted(p.stem for p in directory.glob("*.toml")) if directory.is_dir() else []
    if not names:
        raise ProfileError(f"no bundled device profiles found in {directory} (is edge_sdk installed correctly?)")
    return names


def _looks_like_path(value: str) -> bool:
    return value.endswith(".toml") or "/" in value or os.sep in value


def load_profile(name_or_path: Union[str, os.PathLike[str]]) -> DeviceProfile:
    """Load a bundled profile by name (``"raspberry-pi-5"``) or any profile file by path.

    A string is taken as a path when it ends in ``.toml`` or contains a path
    separator; an ``os.PathLike`` is always a path.  Raises ProfileError for an
    unknown name (listing the known ones), a missing or unreadable file, bad
    TOML, an unknown or missing key, or an invalid value (naming the file and key).
    """
    if isinstance(name_or_path, os.PathLike) or (isinstance(name_or_path, str) and _looks_like_path(name_or_path)):
        return _load_file(Path(name_or_path))
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ProfileError(f"expected a profile name or a path to a .toml file, got {name_or_path!r}")
    known = list_profiles()
    if name_or_path not in known:
        raise ProfileError(f"unknown device profile {name_or_path!r}; known profiles: {', '.join(known)}")
    return _load_file(profiles_dir() / f"{name_or_path}.toml")


def _bundled_profiles() -> list[DeviceProfile]:
    return [_load_file(profiles_dir() / f"{name}.toml") for name in list_profiles()]


# --------------------------------------------------------------------------- facts


def _normalise_machine(machine: str) -> str:
    value = machine.strip().lower()
    return _MACHINE_ALIASES.get(value, value)


@dataclass(frozen=True)
class HardwareFacts:
    """What the machine says about itself, read from ``/proc`` and ``/sys``.

    Missing sources are ``None`` (or empty), never errors.  ``machine`` is
    normalised (``arm64`` -> ``aarch64``, ``AMD64`` -> ``x86_64``);
    ``cpu_features`` holds the lower-case x86 ``flags`` / Arm ``Features``
    present on every processor; ``mem_total_mb`` is MemTotal in MiB.
    """

    machine: str | None = None
    device_tree_model: str | None = None
    device_tree_compatible: tuple[str, ...] = ()
    nv_tegra_release: str | None = None
    l4t_release: str | None = None
    cpu_model: str | None = None
    cpu_features: frozenset[str] = field(default_factory=frozenset)
    cpu_count: int | None = None
    mem_total_mb: int | None = None

    def __post_init__(self) -> None:
        if self.machine is not None:
            _set(self, "machine", _normalise_machine(self.machine))
        _set(self, "device_tree_compatible", tuple(self.device_tree_compatible))
        _set(self, "cpu_features", frozenset(f.lower() for f in self.cpu_features))

    @property
    def has_avx512_vnni(self) -> bool:
        """x86 AVX-512 VNNI (int8 dot products), flag ``avx512_vnni``."""
        return "avx512_vnni" in self.cpu_features

    @property
    def has_avx_vnni(self) -> bool:
        """x86 AVX-VNNI (VEX-encoded, e.g. Alder Lake), flag ``avx_vnni``."""
        return "avx_vnni" in self.cpu_features

    @property
    def has_arm_dotprod(self) -> bool:
        """Arm SDOT/UDOT (Armv8.2 DotProd, e.g. Cortex-A76/A78), feature ``asimddp``."""
        return "asimddp" in self.cpu_features

    @property
    def has_arm_fp16(self) -> bool:
        """Arm half-precision arithmetic, scalar and vector: ``fphp`` and ``asimdhp``."""
        return {"fphp", "asimdhp"} <= self.cpu_features

    @property
    def has_arm_i8mm(self) -> bool:
        """Arm int8 matrix multiply (Armv8.6 I8MM), feature ``i8mm``."""
        return "i8mm" in self.cpu_features

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (features sorted)."""
        return {
            "machine": self.machine,
            "device_tree_model": self.device_tree_model,
            "device_tree_compatible": list(self.device_tree_compatible),
            "nv_tegra_release": self.nv_tegra_release,
            "l4t_release": self.l4t_release,
            "cpu_model": self.cpu_model,
            "cpu_features": sorted(self.cpu_features),
            "cpu_count": self.cpu_count,
            "mem_total_mb": self.mem_total_mb,
        }


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (OSError, ValueError):
        return None


def _read_text(path: Path) -> str | None:
    data = _read_bytes(path)
    return None if data is None else data.decode("utf-8", errors="replace")


def _first_readable(root: Path, relatives: Sequence[str]) -> bytes | None:
    for rel in relatives:
        data = _read_bytes(root / rel)
        if data is not None:
            return data
    return None


def _parse_l4t_release(line: str | None) -> str | None:
    if not line:
        return None
    found = _RELEASE_RE.match(line.strip())
    if not found:
        return None
    return f"R{found.group(1)}.{found.group(2).rstrip('.')}"


def _parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """Split /proc/cpuinfo into blocks of ``key -> value`` (keys as written)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for raw in text.splitlines():
        if not raw.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = raw.partition(":")
        if sep:
            current.setdefault(key.strip(), value.strip())
    if current:
        blocks.append(current)
    return blocks


def _cpu_summary(blocks: list[dict[str, str]]) -> tuple[int, str | None, frozenset[str], str | None]:
    """Return (processor count, cpu model, common features, inferred machine)."""
    processors = [b for b in blocks if b.get("processor", "").isdigit()]
    feature_sets = [frozenset(b[k].lower().split()) for b in processors for k in ("flags", "Features") if k in b]
    features = frozenset.intersection(*feature_sets) if feature_sets else frozenset()

    models: list[str] = []
    for block in processors:
        part = block.get("CPU part", "").lower()
        if block.get("CPU implementer", "").lower() == "0x41" and part in _ARM_PARTS:
            name = _ARM_PARTS[part]
        else:
            name = block.get("model name") or (
                f"Arm implementer {block['CPU implementer']} part {block['CPU part']}"
                if "CPU implementer" in block and "CPU part" in block
                else ""
            )
        if name and name not in models:
            models.append(name)

    keys = {k for b in blocks for k in b}
    machine: str | None = None
    if "flags" in keys or "vendor_id" in keys:
        machine = "x86_64"
    elif "Features" in keys or "CPU implementer" in keys:
        archs = {b.get("CPU architecture", "").strip() for b in processors}
        machine = "armv7l" if archs == {"7"} else "aarch64"
    return len(processors), (" + ".join(models) or None), features, machine


def _mem_total_mb(text: str | None) -> int | None:
    if not text:
        return None
    found = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.MULTILINE)
    return int(found.group(1)) // 1024 if found else None


def _is_host_root(root: Path) -> bool:
    return root == Path("/")


def read_facts(root: Union[str, os.PathLike[str]] = "/", *, machine: str | None = None) -> HardwareFacts:
    """Read hardware facts below ``root`` (``"/"`` for this machine).

    Reads ``proc/device-tree/model`` (else ``sys/firmware/devicetree/base/model``),
    the matching ``compatible``, ``etc/nv_tegra_release``, ``proc/cpuinfo`` and
    ``proc/meminfo``.  A missing or unreadable file is an absent fact, never an
    exception.  ``machine`` defaults to ``platform.machine()`` only when ``root``
    is ``"/"``; for another root it is inferred from cpuinfo (x86 ``flags`` /
    ``vendor_id``; Arm ``Features`` / ``CPU implementer``) unless given.
    """
    base = Path(root)
    host = _is_host_root(base)

    model_raw = _first_readable(base, ("proc/device-tree/model", "sys/firmware/devicetree/base/model"))
    model = model_raw.decode("utf-8", errors="replace").replace("\0", " ").strip() if model_raw else ""
    compat_raw = _first_readable(base, ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible"))
    compatible = tuple(
        part.decode("utf-8", errors="replace").strip() for part in (compat_raw or b"").split(b"\0") if part.strip()
    )

    release_text = _read_text(base / "etc/nv_tegra_release")
    release_line = next((ln.strip() for ln in (release_text or "").splitlines() if ln.strip()), None)

    cpuinfo = _read_text(base / "proc/cpuinfo")
    count, cpu_model, features, inferred = _cpu_summary(_parse_cpuinfo(cpuinfo or ""))
    cpu_count: int | None = count or None
    if cpu_count is None and host:
        cpu_count = os.cpu_count()

    if machine is None:
        machine = platform.machine() if host else inferred

    return HardwareFacts(
        machine=machine or None,
        device_tree_model=model or None,
        device_tree_compatible=compatible,
        nv_tegra_release=release_line,
        l4t_release=_parse_l4t_release(release_line),
        cpu_model=cpu_model,
        cpu_features=features,
        cpu_count=cpu_count,
        mem_total_mb=_mem_total_mb(_read_text(base / "proc/meminfo")),
    )


# --------------------------------------------------------------------------- detection


def effective_memory_budget_mb(runtime: RuntimeSpec, mem_total_mb: int | None) -> int:
    """Effective model memory budget in MiB: ``min(cap, floor(fraction * MemTotal))``.

    With MemTotal unknown the cap alone applies.  Never below 1 MiB.
    """
    if mem_total_mb is None:
        return runtime.memory_budget_mb
    return max(1, min(runtime.memory_budget_mb, int(runtime.memory_budget_fraction * mem_total_mb)))


@dataclass(frozen=True)
class BoardMatch:
    """Which board matched: the profile in use and why (what :func:`resolve_profile` and :func:`detect` return).

    * ``source``: ``"override-arg"`` (given by the caller), ``"override-env"``
      (``EDGE_SDK_PROFILE``), ``"detected"`` (matched this hardware) or
      ``"fallback"`` (nothing matched; ``generic-<arch>``).
    * ``fallback``: True only for ``source == "fallback"``.
    * ``reasons``: human sentences saying what matched or why nothing did.
    * ``memory_budget_mb``: effective budget in MiB (see :func:`effective_memory_budget_mb`).
    """

    profile: DeviceProfile
    facts: HardwareFacts
    reasons: tuple[str, ...]
    source: str
    fallback: bool
    memory_budget_mb: int

    def __post_init__(self) -> None:
        if self.source not in DETECTION_SOURCES:
            raise ProfileError(f"source: expected one of {list(DETECTION_SOURCES)}, got {self.source!r}")
        if self.fallback != (self.source == "fallback"):
            raise ProfileError(f"fallback: expected {self.source == 'fallback'} for source {self.source!r}")
        _set(self, "reasons", tuple(self.reasons))

    def explain(self) -> str:
        """A few lines for humans: profile, how it was chosen, and the budgets."""
        p, f = self.profile, self.facts
        runtime = p.runtime
        lines = [f"profile: {p.name} ({p.display_name}) [{self.source}]"]
        lines += [f"  - {reason}" for reason in self.reasons]
        lines.append(
            f"machine: {f.machine or 'unknown'}; cpu: {f.cpu_model or 'unknown'} x {f.cpu_count or '?'}; "
            f"memory: {f.mem_total_mb if f.mem_total_mb is not None else '?'} MiB"
        )
        if f.mem_total_mb is None:
            budget = f"{self.memory_budget_mb} MiB (cap; MemTotal unknown)"
        else:
            budget = (
                f"{self.memory_budget_mb} MiB = min(cap {runtime.memory_budget_mb} MiB, "
                f"{runtime.memory_budget_fraction:g} x MemTotal {f.mem_total_mb} MiB)"
            )
        lines.append(f"memory budget: {budget}")
        lines.append(
            f"runtime: precisions {', '.join(runtime.precisions)}; backends {', '.join(runtime.backends)}; "
            f"threads {runtime.threads}"
        )
        t = p.thermal
        lines.append(
            f"thermal: warn {t.warn_c:g} C, critical {t.critical_c:g} C, vendor throttle {t.vendor_throttle_c:g} C"
        )
        budget_w = f"{p.power.budget_w:g} W" if p.power.budget_w > 0 else "unknown"
        lines.append(f"power: sensor {p.power.sensor}, budget {budget_w}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "profile": self.profile.to_dict(),
            "facts": self.facts.to_dict(),
            "reasons": list(self.reasons),
            "source": self.source,
            "fallback": self.fallback,
            "memory_budget_mb": self.memory_budget_mb,
        }


@dataclass(frozen=True)
class _Match:
    profile: DeviceProfile
    score: tuple[int, int, int]
    reasons: tuple[str, ...]


def _match_profile(profile: DeviceProfile, facts: HardwareFacts) -> _Match | None:
    spec = profile.match
    reasons: list[str] = []

    model_len = 0
    if facts.device_tree_model:
        folded = facts.device_tree_model.casefold()
        hits = [s for s in spec.device_tree_model if s.casefold() in folded]
        if hits:
            best = max(hits, key=len)
            model_len = len(best)
            reasons.append(f"device-tree model {facts.device_tree_model!r} contains {best!r}")

    compat_hits = [c for c in spec.device_tree_compatible if c in facts.device_tree_compatible]
    if compat_hits:
        reasons.append(f"device-tree compatible lists {', '.join(repr(c) for c in compat_hits)}")

    release_len = 0
    if facts.nv_tegra_release:
        forms = [facts.nv_tegra_release.lstrip("#").strip()]
        if facts.l4t_release:
            forms.append(facts.l4t_release)
        hits = [prefix for prefix in spec.nv_tegra_release if any(form.startswith(prefix) for form in forms)]
        has_device_tree = bool(facts.device_tree_model or facts.device_tree_compatible)
        has_dt_patterns = bool(spec.device_tree_model or spec.device_tree_compatible)
        if hits and (not has_device_tree or not has_dt_patterns):
            best = max(hits, key=len)
            release_len = len(best)
            reasons.append(f"/etc/nv_tegra_release {facts.nv_tegra_release!r} starts with {best!r}")

    score = (model_len, len(compat_hits), release_len)
    if score == (0, 0, 0):
        return None
    return _Match(profile, score, tuple(reasons))


def _observed(facts: HardwareFacts) -> str:
    parts = [
        f"device-tree model {facts.device_tree_model!r}" if facts.device_tree_model else "no device-tree model",
        f"compatible {list(facts.device_tree_compatible)!r}" if facts.device_tree_compatible else "no compatible",
        f"nv_tegra_release {facts.nv_tegra_release!r}" if facts.nv_tegra_release else "no /etc/nv_tegra_release",
    ]
    return ", ".join(parts)


def _detect_from_facts(facts: HardwareFacts, profiles: Sequence[DeviceProfile]) -> BoardMatch:
    arch = facts.machine
    if arch is None:
        raise ProfileError("cannot tell this machine's architecture; pass machine='x86_64' or 'aarch64'")
    if arch not in ARCHES:
        raise ProfileError(
            f"unsupported machine architecture {arch!r}: edge_sdk has profiles for {', '.join(ARCHES)} only"
        )

    notes: list[str] = []
    candidates: list[_Match] = []
    for profile in profiles:
        if profile.generic:
            continue
        found = _match_profile(profile, facts)
        if found is None:
            continue
        if profile.arch != arch:
            notes.append(f"{profile.name} matched ({'; '.join(found.reasons)}) but needs {profile.arch}, not {arch}")
            continue
        candidates.append(found)

    if candidates:
        top = max(c.score for c in candidates)
        best = [c for c in candidates if c.score == top]
        # A tie is genuinely ambiguous: take the smaller power budget, the safer guess.
        best.sort(key=lambda c: (c.profile.power.budget_w or math.inf, c.profile.name))
        chosen = best[0]
        reasons = list(chosen.reasons)
        others = [c.profile.name for c in candidates if c is not chosen]
        if len(best) > 1:
            reasons.append(
                f"ambiguous: {', '.join(c.profile.name for c in best)} match equally well; chose "
                f"{chosen.profile.name} (smaller power budget); set {ENV_VAR} to override"
            )
        elif others:
            reasons.append(f"more specific than {', '.join(sorted(others))}")
        reasons.append(f"architecture {arch} matches the profile")
        reasons += notes
        return BoardMatch(
            profile=chosen.profile,
            facts=facts,
            reasons=tuple(reasons),
            source="detected",
            fallback=False,
            memory_budget_mb=effective_memory_budget_mb(chosen.profile.runtime, facts.mem_total_mb),
        )

    generic_name = f"generic-{arch}"
    generic = next((p for p in profiles if p.generic and p.name == generic_name), None)
    if generic is None:
        raise ProfileError(f"no profile matched and no {generic_name!r} fallback profile is available")
    reasons = [f"no {arch} profile matched ({_observed(facts)}); using {generic_name}", *notes]
    return BoardMatch(
        profile=generic,
        facts=facts,
        reasons=tuple(reasons),
        source="fallback",
        fallback=True,
        memory_budget_mb=effective_memory_budget_mb(generic.runtime, facts.mem_total_mb),
    )


def detect(
    root: Union[str, os.PathLike[str]] = "/",
    *,
    machine: str | None = None,
    profiles: Sequence[DeviceProfile] | None = None,
) -> BoardMatch:
    """Detect the board below ``root`` and choose its profile.

    Every non-generic profile is tried (device-tree model substring,
    compatible entry, L4T release prefix); its ``arch`` must equal the
    machine's.  The most specific match wins: the longest model substring,
    then the most compatible hits, then the longest release prefix.  Unknown
    hardware falls back to ``generic-<arch>`` with ``fallback=True``.
    ``profiles`` replaces the bundled set (for custom profile sets and tests).
    Raises ProfileError for an unknown or undeterminable architecture.
    """
    facts = read_facts(root, machine=machine)
    return _detect_from_facts(facts, _bundled_profiles() if profiles is None else profiles)


def resolve_profile(
    profile: Union[DeviceProfile, str, os.PathLike[str], None] = None,
    *,
    root: Union[str, os.PathLike[str]] = "/",
    machine: str | None = None,
    env: Mapping[str, str] | None = None,
) -> BoardMatch:
    """Choose the profile to use: the argument, else ``$EDGE_SDK_PROFILE``, else :func:`detect`.

    ``profile`` may be a DeviceProfile, a bundled name or a path to a .toml
    file (source ``"override-arg"``).  ``EDGE_SDK_PROFILE`` takes a name or a
    path (source ``"override-env"``); ``env`` defaults to ``os.environ``.
    Facts are read from ``root`` in every case so the memory budget reflects
    this machine.  Raises ProfileError for an unknown name or a bad file.
    """
    facts = read_facts(root, machine=machine)
    environ = os.environ if env is None else env

    chosen: DeviceProfile
    if profile is not None:
        chosen = profile if isinstance(profile, DeviceProfile) else load_profile(profile)
        source = "override-arg"
        how = f"profile {chosen.name!r} given by the caller"
        if isinstance(profile, os.PathLike) or (isinstance(profile, str) and _looks_like_path(profile)):
            how += f" (file {chosen.path})"
    elif environ.get(ENV_VAR, "").strip():
        value = environ[ENV_VAR].strip()
        try:
            chosen = load_profile(value)
        except ProfileError as exc:
            raise ProfileError(f"{ENV_VAR}={value!r}: {exc}") from exc
        source = "override-env"
        how = f"{ENV_VAR}={value!r} selects {chosen.name!r}"
    else:
        return _detect_from_facts(facts, _bundled_profiles())

    reasons = [how]
    if facts.machine is not None and facts.machine != chosen.arch:
        reasons.append(f"note: profile is for {chosen.arch} but this machine is {facts.machine}")
    return BoardMatch(
        profile=chosen,
        facts=facts,
        reasons=tuple(reasons),
        source=source,
        fallback=False,
        memory_budget_mb=effective_memory_budget_mb(chosen.runtime, facts.mem_total_mb),
    )
