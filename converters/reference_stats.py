"""Reference statistics for on-device quality monitoring (``reference_stats.json`` in a package).

``edge-convert quantize`` calls :func:`write_reference_stats` on the calibration and validation
data with the fp32 reference variant: every sample runs through ``edge_sdk.load(...).predict``
with a :class:`~edge_sdk.package.reference_stats.ReferenceBuilder` attached where a monitor would be,
so the summaries are computed by the same code, on the same tensors, as on the device. The file
goes into the package, covered by sha256 and size in the manifest's ``[reference_stats]`` table.

    python -m converters.reference_stats PKG DATA [--out reference_stats.json]   # for an existing package
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edge_sdk.package.reference_stats import ReferenceStats, reference_from_model

REFERENCE_FILE = "reference_stats.json"


def compute_reference_stats(
    package: Any, samples: Sequence[Mapping[str, np.ndarray] | np.ndarray], source: str = "", cache_dir: Path | None = None, profile: Any = None
) -> ReferenceStats:
    """Reference statistics of ``package``'s reference variant (a ModelPackage or a path) over
    ``samples`` (model-ready feeds, as the calibration loader makes them), loaded for ``profile``
    (default: this device's; the stats do not depend on it)."""
    import edge_sdk
    from edge_sdk.package import ModelPackage

    pkg = package if isinstance(package, ModelPackage) else ModelPackage.open(package)
    opts: dict[str, Any] = {"variant": pkg.manifest.reference_variant.id, "telemetry": False, "measure_backends": False}
    if cache_dir is not None:
        opts["cache_dir"] = Path(cache_dir)
    with edge_sdk.load(pkg, profile, **opts) as model:
        return reference_from_model(model, samples, source=source)


def write_reference_stats(
    package: Any, samples: Sequence[Any], out: Path, source: str = "", cache_dir: Path | None = None, profile: Any = None
) -> str:
    """Compute the stats and write them to ``out``; returns the manifest's ``reference_stats``
    entry (the file name: packaging fills in its digest and size)."""
    stats = compute_reference_stats(package, samples, source, cache_dir, profile)
    Path(out).write_text(stats.to_json())
    return REFERENCE_FILE


def main(argv: list[str] | None = None) -> int:
    """``python -m converters.reference_stats PKG DATA [--out FILE] [--limit N]``: compute and write the stats, print a summary."""
    ap = argparse.ArgumentParser(description="Compute reference statistics of a package's reference variant over data (prints a summary).")
    ap.add_argument("package", type=Path)
    ap.add_argument("data", type=Path, help="calibration-style data: image folder, .npy/.npz, video, .csv of sensor windows")
    ap.add_argument("--out", type=Path, default=Path(REFERENCE_FILE))
    ap.add_argument("--limit", type=int, default=512)
    args = ap.parse_args(argv)
    from edge_sdk.package import ModelPackage

    from .calibration import load_data

    pkg = ModelPackage.open(args.package)
    ds = load_data(args.data, pkg.manifest.inputs_for(pkg.manifest.reference_variant), limit=args.limit, progress=False)
    stats = compute_reference_stats(pkg, list(ds.samples), str(args.data))
    args.out.write_text(stats.to_json())
    for k, s in stats.summaries.items():
        print(f"{k:32s} mean {s.mean:10.4f}  std {s.std:10.4f}  n {s.n}")
    print(f"wrote {args.out} ({stats.samples} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
