"""What a board says about itself, read from a root (``/`` on a device, a recorded fake tree in
tests): :class:`HardwareFacts` and :func:`read_facts` (device tree, ``/etc/nv_tegra_release``,
``/proc/cpuinfo``, ``/proc/meminfo``)."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

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
            object.__setattr__(self, "machine", _normalise_machine(self.machine))
        object.__setattr__(self, "device_tree_compatible", tuple(self.device_tree_compatible))
        object.__setattr__(self, "cpu_features", frozenset(f.lower() for f in self.cpu_features))

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
