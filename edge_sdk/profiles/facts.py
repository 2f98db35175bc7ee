"""What a board says about itself, read from a root (``/`` on a device, a recorded fake tree in
tests): :class:`HardwareFacts` and :func:`read_facts` (device tree, ``/etc/nv_tegra_release``,
``/proc/cpuinfo``, ``/proc/meminfo``, and what this process may use: its CPU affinity mask and
its cgroup's CPU quota).

The CPUs a process may use are not the CPUs the machine has: ``taskset``/``sched_setaffinity(2)``
narrow the set the scheduler runs it on, and a container's cgroup caps the CPU time it gets
(cgroup v2 ``cpu.max`` = ``"$MAX $PERIOD"``, Linux Documentation/admin-guide/cgroup-v2.rst; v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, Documentation/scheduler/sched-bwc.rst). Thread pools
sized from ``/proc/cpuinfo`` oversubscribe such a process; :attr:`HardwareFacts.usable_cpus` is
the smaller of the two, the quota rounded up as the JDK's and Go's container support do.
"""

from __future__ import annotations

import math
import os
import platform
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Sequence, Union

from .._record import frozen

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


@frozen
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
    cpus_allowed: int | None = None
    cpu_quota: float | None = None

    def __post_init__(self) -> None:
        if self.machine is not None:
            object.__setattr__(self, "machine", _normalise_machine(self.machine))
        object.__setattr__(self, "device_tree_compatible", tuple(self.device_tree_compatible))
        object.__setattr__(self, "cpu_features", frozenset(f.lower() for f in self.cpu_features))

    @property
    def usable_cpus(self) -> int | None:
        """The CPUs this process may keep busy: the affinity mask's count (``cpus_allowed``), capped
        by the cgroup CPU quota rounded up (``cpu_quota``), else the machine's ``cpu_count``;
        None when nothing is known. What thread pools and worker counts are sized from."""
        n = self.cpus_allowed if self.cpus_allowed is not None else self.cpu_count
        if self.cpu_quota is not None:
            q = max(1, math.ceil(self.cpu_quota - 1e-9))
            n = q if n is None else min(n, q)
        return n

    def cpu_budget_text(self) -> str:
        """One line saying where :attr:`usable_cpus` comes from, for ``edge-sdk profile``."""
        parts = [f"{self.cpu_count if self.cpu_count is not None else '?'} on the machine"]
        if self.cpus_allowed is not None:
            parts.append(f"{self.cpus_allowed} in this process's affinity mask")
        parts.append("no cgroup CPU quota" if self.cpu_quota is None else f"cgroup CPU quota {self.cpu_quota:g}")
        return f"{self.usable_cpus if self.usable_cpus is not None else '?'} usable ({', '.join(parts)})"

    @property
    def int8_saturates(self) -> bool:
        """x86 without VNNI (no ``avx512_vnni``, ``avx_vnni`` or ``amx_int8``): ONNX Runtime's u8s8 int8
        kernels multiply with VPMADDUBSW there, whose 16-bit pair sums can saturate, and int8 is often no
        faster than fp32 (ORT's quantization docs: reduce_range or U8U8 on such CPUs). Arm's int8 paths
        (SDOT/UDOT, or widening multiplies without DotProd) do not saturate."""
        return self.machine == "x86_64" and not ({"avx512_vnni", "avx_vnni", "amx_int8"} & self.cpu_features)

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
            "cpus_allowed": self.cpus_allowed,
            "cpu_quota": self.cpu_quota,
            "usable_cpus": self.usable_cpus,
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


def _cpu_list_count(text: str) -> int | None:
    """Count the CPUs of a kernel cpu list (``"0-3,8,10-11"``, as ``Cpus_allowed_list`` writes it)."""
    n = 0
    for part in text.strip().split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        n += (int(hi) - int(lo) + 1) if sep else 1
    return n or None


def _cpus_allowed(base: Path, host: bool) -> int | None:
    """The affinity mask's CPU count: ``os.sched_getaffinity(0)`` on this machine, else the
    ``Cpus_allowed_list`` line of ``proc/self/status`` below ``base`` (proc(5))."""
    if host and hasattr(os, "sched_getaffinity"):
        try:
            return len(os.sched_getaffinity(0)) or None
        except OSError:
            pass
    status = _read_text(base / "proc/self/status") or ""
    found = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE)
    return _cpu_list_count(found.group(1)) if found else None


def _quota_v2(text: str | None) -> float | None:
    fields = (text or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(quota_text: str | None, period_text: str | None) -> float | None:
    try:
        quota, period = int((quota_text or "").strip()), int((period_text or "").strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None  # -1: no limit


def _cpu_quota(base: Path) -> float | None:
    """The tightest CPU quota (in CPUs) on this process's cgroup and its ancestors, or None.

    The cgroup comes from ``proc/self/cgroup`` (v2: ``0::/path``; v1: the ``cpu`` controller's line);
    limits nest, so every level from the process's group up to the mount root is read."""
    quotas: list[float] = []
    for line in (_read_text(base / "proc/self/cgroup") or "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        v2 = hier == "0" and controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        mounts = [base / "sys/fs/cgroup"] if v2 else [base / "sys/fs/cgroup" / name for name in ("cpu,cpuacct", "cpu")]
        rel = [p for p in path.strip().split("/") if p and p != ".."]
        for mount in mounts:
            for depth in range(len(rel), -1, -1):
                d = mount.joinpath(*rel[:depth])
                q = _quota_v2(_read_text(d / "cpu.max")) if v2 else _quota_v1(_read_text(d / "cpu.cfs_quota_us"), _read_text(d / "cpu.cfs_period_us"))
                if q is not None:
                    quotas.append(q)
    return min(quotas) if quotas else None


def usable_cpus() -> int:
    """The CPUs this process may keep busy (affinity mask, capped by the cgroup CPU quota rounded
    up), never below 1: what to size thread pools and worker counts from, instead of
    ``os.cpu_count()`` (which counts the machine's CPUs, not this process's)."""
    root = Path("/")
    facts = HardwareFacts(cpu_count=os.cpu_count(), cpus_allowed=_cpus_allowed(root, True), cpu_quota=_cpu_quota(root))
    return facts.usable_cpus or 1


def _is_host_root(root: Path) -> bool:
    return root == Path("/")


def read_facts(root: Union[str, os.PathLike[str]] = "/", *, machine: str | None = None) -> HardwareFacts:
    """Read hardware facts below ``root`` (``"/"`` for this machine).

    Reads ``proc/device-tree/model`` (else ``sys/firmware/devicetree/base/model``),
    the matching ``compatible``, ``etc/nv_tegra_release``, ``proc/cpuinfo``,
    ``proc/meminfo``, the affinity mask (``os.sched_getaffinity`` on this machine,
    ``proc/self/status`` ``Cpus_allowed_list`` below another root) and the cgroup CPU
    quota (``proc/self/cgroup``, then ``sys/fs/cgroup/.../cpu.max`` or the v1
    ``cpu.cfs_quota_us``).  A missing or unreadable file is an absent fact, never an
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
        cpus_allowed=_cpus_allowed(base, host),
        cpu_quota=_cpu_quota(base),
    )
