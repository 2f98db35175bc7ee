"""What every benchmark figure is recorded with: the machine it ran on.

A ratio measured on one CPU does not carry to another (an int8 kernel that wins with AVX-512 VNNI
loses without it; a 5 us overhead on a 5.7 GHz core is 15 us on a 2.8 GHz one), so every
``tools/bench/bench_*.py`` JSON and every ``docs/benchmarks.md`` section carries
:func:`machine_record`: CPU model, the flags that decide inference speed, the CPUs this process
may use, the load average at the start and end, and the date.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from typing import Any

from ..profiles.facts import read_facts, usable_cpus

#: CPU flags that decide how fast int8/int4/fp16 kernels run (x86 and Arm names, as /proc/cpuinfo spells them).
CPU_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
    "asimd", "asimddp", "asimdhp", "fphp", "i8mm", "sve",
)  # fmt: skip


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _version(module: str) -> str | None:
    from importlib import metadata

    for dist in {"onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"), "litert": ("ai-edge-litert", "tflite-runtime")}.get(
        module, (module,)
    ):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def machine_record(root: str = "/") -> dict[str, Any]:
    """The machine a benchmark runs on, taken at its start (call :func:`finish_record` at its end)."""
    f = read_facts(root)
    import numpy

    return {
        "machine": platform.machine(),
        "cpu_model": f.cpu_model,
        "cpu_count": f.cpu_count,
        "usable_cpus": usable_cpus() if root == "/" else f.usable_cpus,
        "cpu_flags": [x for x in CPU_FLAGS if x in f.cpu_features],
        "mem_total_mb": f.mem_total_mb,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "onnxruntime": _version("onnxruntime"),
        "litert": _version("litert"),
        "platform": sys.platform,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_before": loadavg(),
        "loadavg_after": None,
    }


def finish_record(record: dict[str, Any]) -> dict[str, Any]:
    """Add the load average at the end of the run (in place; returned for chaining)."""
    record["loadavg_after"] = loadavg()
    return record


def machine_line(record: dict[str, Any]) -> str:
    """One line for a report: ``CPU model x N (usable M), flags; date; load before -> after``."""
    flags = ", ".join(record.get("cpu_flags") or []) or "none of the recorded flags"
    usable = record.get("usable_cpus")
    cpus = f"{record.get('cpu_count') or '?'} CPUs" + (f" ({usable} usable)" if usable and usable != record.get("cpu_count") else "")
    return (
        f"{record.get('cpu_model') or 'unknown CPU'} ({record.get('machine')}, {cpus}; flags: {flags}); "
        f"{record.get('date_utc')}; load average {record.get('loadavg_before')} before, {record.get('loadavg_after')} after"
    )
