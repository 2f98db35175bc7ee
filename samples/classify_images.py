"""Classify image files with a model package, the way an app embeds edge_sdk.

    python samples/classify_images.py [PACKAGE] [IMAGE ...]

With no arguments it uses the bundled demo package and sample images. It
prints why the variant was chosen, one line per image, and the median latency.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import edge_sdk
from edge_sdk.assets import demo_package_path, demo_samples


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Classify image files with a model package.")
    ap.add_argument("package", nargs="?", type=Path, help="package folder or archive (default: the bundled demo)")
    ap.add_argument("images", nargs="*", type=Path, help="image files (default: the bundled sample images)")
    args = ap.parse_args(argv)
    package = args.package or demo_package_path()
    images = args.images or demo_samples()
    try:
        model = edge_sdk.load(package)  # profile: $EDGE_SDK_PROFILE or the detected device
    except edge_sdk.EdgeSDKError as e:
        print(f"cannot load {package}: {e}", file=sys.stderr)
        return 1
    with model:
        print(model.selection.explain(), end="\n\n")
        totals = []
        for path in images:
            try:
                r = model.predict_image(path)
            except edge_sdk.errors.InputError as e:  # unreadable image, wrong shape ...
                print(f"{path.name}: skipped ({e})")
                continue
            totals.append(r.timings.total_ms)
            print(f"{path.name}: {r.top1.label} ({r.top1.score:.2f})  {r.timings.total_ms:.2f} ms")
        if totals:
            print(f"\nmedian {statistics.median(totals):.2f} ms over {len(totals)} images on {model.variant.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
