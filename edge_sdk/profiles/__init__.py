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

The modules, each importing only the ones before it: :mod:`.profile` (the schema and loading),
:mod:`.facts` (reading a board), :mod:`.detect` (matching and resolving).
"""

from __future__ import annotations

from ..errors import ProfileError  # the error every function here raises
from .detect import DETECTION_SOURCES, BoardMatch, detect, effective_memory_budget_mb, resolve_profile
from .facts import HardwareFacts, read_facts, usable_cpus
from .profile import (
    ARCHES,
    BACKENDS,
    ENV_VAR,
    GRAPH_OPTIMIZATIONS,
    POWER_SENSORS,
    PRECISIONS,
    SCHEMA_VERSION,
    DeviceProfile,
    MatchSpec,
    PowerSpec,
    RuntimeSpec,
    ThermalSpec,
    list_profiles,
    load_profile,
    profiles_dir,
)

__all__ = [
    "ARCHES",
    "BACKENDS",
    "DETECTION_SOURCES",
    "ENV_VAR",
    "GRAPH_OPTIMIZATIONS",
    "POWER_SENSORS",
    "PRECISIONS",
    "ProfileError",
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
    "usable_cpus",
    "resolve_profile",
]
