"""Hello world of embedding edge_sdk in an app: load a package, predict, read the telemetry.

    python samples/embed_app.py [PACKAGE] [IMAGE ...] [--repeat N]

With no arguments it uses the bundled demo package and its sample images.
"""

from __future__ import annotations

import argparse
import sys

import edge_sdk
from edge_sdk.assets import demo_package_path, demo_samples
from edge_sdk.telemetry import default_registry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Load a model package, classify images, print its telemetry.")
    ap.add_argument("package", nargs="?", default=str(demo_package_path()), help="package folder, .zip or .tar (default: the demo)")
    ap.add_argument("images", nargs="*", help="image files (default: the demo's sample images)")
    ap.add_argument("--repeat", type=int, default=3, help="predictions per image (default 3)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat: expected >= 1, got {args.repeat}")
    images = args.images or [str(p) for p in demo_samples()]

    try:
        # One load per process: digests verified, variant chosen for this device ($EDGE_SDK_PROFILE or detected).
        with edge_sdk.load(args.package) as model:
            for path in images:
                for _ in range(args.repeat):
                    r = model.predict_image(path)  # preprocessing comes from the package's manifest
                t = r.timings  # the last call's stages, in ms
                print(
                    f"{path}: {r.top1.label} {r.top1.score:.3f}  total {t.total_ms:.3f} ms "
                    f"(preprocess {t.preprocess_ms:.3f}, inference {t.inference_ms:.3f}, decode {t.decode_ms:.3f})"
                )
            # Every result carries what produced it: log this with any answer you may have to explain later.
            p = r.provenance
            print(
                f"provenance: {p.model} {p.version} variant {p.variant} sha256 {p.sha256[:12]} on {p.runtime} {p.runtime_version}, "
                f"profile {p.profile}, sdk {p.sdk_version}"
            )

            # Every call was timed per stage into the model's histograms (no setup needed; cheap to read).
            tm = model.telemetry
            print(f"telemetry: requests {tm.requests} errors {tm.errors}")
            print(f"{'stage':<11}{'count':>7}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}")
            for stage, h in tm.histograms.items():
                snap = h.snapshot()  # one consistent copy: count and percentiles from the same buckets
                if snap.count:  # a stage this model never ran (e.g. preprocess for tensor input) stays empty
                    q = snap.percentiles((50, 90, 99))  # seconds, within 1.94 % (fixed exponential buckets)
                    print(f"{stage:<11}{snap.count:>7}{q[50] * 1e3:>10.3f}{q[90] * 1e3:>10.3f}{q[99] * 1e3:>10.3f}")

            # The same numbers as Prometheus samples: what MetricsServer(port=9100) would serve at /metrics.
            for s in default_registry().snapshot():
                if s["name"] == "edge_sdk_model_requests_total":
                    print(f"registry: {s['name']}{{variant={s['labels']['variant']}}} {s['value']:g}")
    except edge_sdk.errors.InputError as e:  # an unreadable image, a wrong shape, ...: says expected vs actual
        print(f"bad input: {e}", file=sys.stderr)
        return 2
    except edge_sdk.EdgeSDKError as e:  # a broken package, no variant for this device, ...
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
