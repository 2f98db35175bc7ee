"""``edge-sdk``: a thin ``main(argv)`` over the library.

    edge-sdk profile [--profile P] [--root DIR] [--json]
    edge-sdk inspect PACKAGE [--profile P] [--json]
    edge-sdk predict PACKAGE INPUT [--variant V] [--top-k K] [--repeat N] [--deterministic] [--result-cache N] [--json]
    edge-sdk generate PACKAGE --prompt TEXT [--max-tokens N] [--temperature T --top-k K --top-p P --seed S] [--stop S] [--json]
    edge-sdk chat PACKAGE [--system TEXT] [--max-tokens N] [--temperature T ...]
    edge-sdk demo [--runs N] [--variant V] [--json]
    edge-sdk monitor [--profile P] [--root DIR] [--interval S] [--count N] [--url URL] [--json]
    edge-sdk serve PACKAGE... [--host H] [--port N] [--max-batch N] [--max-delay-ms MS] [--queue-size N]
                   [--timeout-s S] [--token-env VAR | --token-file F] [--tls-cert F --tls-key F]
    edge-sdk bench PACKAGE [--variant V ...|--all-variants] [--scenario S ...] [--vs-raw] [--json F] [--plot F.png] ...
    edge-sdk bench --compare A.json B.json
    edge-sdk models list|install|activate|rollback|verify --store DIR [--json]
    edge-sdk run PACKAGE --source SRC [--save OUT.mp4|DIR] [--show] [--jsonl FILE] [--max-fps N] [--max-frames N] [--conf T] ...

Exit codes: 0 ok, 1 an edge_sdk error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ._version import __version__
from .cli_args import add_common, add_load_arguments, load_kwargs
from .errors import EdgeSDKError


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {f"p{q}": round(float(np.percentile(a, q)), 4) for q in (50, 90, 99)} | {"mean": round(float(a.mean()), 4), "n": int(a.size)}


def build_parser() -> argparse.ArgumentParser:
    """The ``edge-sdk`` argument parser with every subcommand (also used to generate docs/reference.md)."""
    ap = argparse.ArgumentParser(prog="edge-sdk", description="Run ML models on edge devices.")
    ap.add_argument("--version", action="version", version=f"edge-sdk {__version__}", help="print the edge-sdk version and exit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile", help="the detected device profile and why, runtimes, providers, sensors")
    add_common(p)
    p = sub.add_parser("inspect", help="a package's manifest, variants, digests, and the selection with its reasons")
    p.add_argument("package", help="package folder, or a .zip/.tar of one")
    add_common(p)
    p = sub.add_parser("predict", help="run a package on an image file or a .npy tensor")
    p.add_argument("package", help="package folder, or a .zip/.tar of one")
    p.add_argument("input", help="image file (PNG/JPEG/...) or .npy array (or .npz with one array per input name)")
    p.add_argument("--top-k", type=int, help="classes to print per result (default: the manifest's decoder top_k)")
    p.add_argument("--repeat", type=int, default=1, help="run N times and report latency percentiles")
    add_common(p)
    add_load_arguments(p, result_cache=True)
    from .generation.command import add_chat_arguments, add_generate_arguments

    p = sub.add_parser("generate", help="generate text with a decoder package (streamed; --json for one object at the end)")
    add_generate_arguments(p)
    p = sub.add_parser("chat", help="chat with a decoder package: one message per line, answers streamed, with its chat template")
    add_chat_arguments(p)
    p = sub.add_parser("demo", help="the bundled shapes classifier on bundled images (no camera, no network)")
    p.add_argument("--runs", type=int, default=200, help="timed runs for latency percentiles (default 200)")
    add_common(p)
    add_load_arguments(p)
    from .budget.command import add_arguments as add_monitor_arguments

    p = sub.add_parser("monitor", help="live temperatures, throttled flags, power rails and governor state (or an app's, with --url)")
    add_monitor_arguments(p)
    add_common(p)
    from .serve.options import add_arguments as add_serve_arguments

    p = sub.add_parser("serve", help="serve packages over the Open Inference Protocol (KServe v2 REST); needs the server extra")
    add_serve_arguments(p)
    from .bench.command import add_arguments as add_bench_arguments

    p = sub.add_parser(
        "bench", help="measure a package on this device in the MLPerf Inference scenarios; compare variants, the raw runtime, two runs"
    )
    add_bench_arguments(p)
    from .store.command import add_arguments as add_models_arguments

    p = sub.add_parser("models", help="a local model store: install (verified, health-gated), activate, roll back, verify")
    add_models_arguments(p)
    from .pipelines.run_command import add_arguments as add_run_arguments

    p = sub.add_parser("run", help="run a package on a camera, video, stream or image folder: annotated video, window, JSON lines")
    add_run_arguments(p)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``edge-sdk``: parse ``argv`` (default ``sys.argv[1:]``), run the command and return its exit status (1 with the
    message on stderr for an :class:`~edge_sdk.errors.EdgeSDKError`, an unreadable file or bad input; 0 on Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        cmds = {
            "profile": cmd_profile, "inspect": cmd_inspect, "predict": cmd_predict, "demo": cmd_demo, "monitor": cmd_monitor, "serve": cmd_serve,
            "models": cmd_models, "generate": cmd_generate, "chat": cmd_chat, "run": cmd_run,
        }  # fmt: skip
        if args.cmd == "bench":
            return cmd_bench(args, argv)
        return cmds[args.cmd](args)
    except KeyboardInterrupt:
        return 0
    except EdgeSDKError as e:
        print(f"edge-sdk: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:  # unreadable input files, bad .npy
        print(f"edge-sdk: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def cmd_profile(args: argparse.Namespace) -> int:
    """``edge-sdk profile``: print the detected device profile and why, the runtimes and providers available, and the sensors found."""
    from .backends.base import all_backend_status
    from .budget.discovery import scan
    from .profiles import resolve_profile

    det = resolve_profile(args.profile, root=args.root)
    backends = all_backend_status()
    sensors = scan(args.root)
    data = {
        "profile": det.profile.to_dict(),
        "source": det.source,
        "fallback": det.fallback,
        "reasons": list(det.reasons),
        "memory_budget_mb": det.memory_budget_mb,
        "facts": {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in det.facts.__dict__.items()},
        "backends": {n: s.__dict__ for n, s in backends.items()},
        "sensors": [s.__dict__ for s in sensors],
    }
    lines = [det.explain(), "", "runtimes:"]
    for n, s in backends.items():
        if s.available:
            build = f" (build {s.build})" if s.build and (s.build != s.runtime or n == "onnxruntime") else ""
            lines.append(f"  {n}: {s.runtime} {s.version}{build}" + (f" providers={list(s.providers)}" if s.providers else ""))
        else:
            lines.append(f"  {n}: not available ({s.detail})")
        lines += [f"    warning: {note}" for note in s.notes]
    rt = det.profile.runtime
    lines.append(f"profile wants: precisions {list(rt.precisions)}, backends {list(rt.backends)}, providers {list(rt.onnxruntime_providers)}")
    lines.append(f"sensors ({len(sensors)}):")
    for reading in sensors[:40]:
        v = "" if reading.value is None else f" = {reading.value:g} {reading.unit}"
        lines.append(f"  {reading.kind:8s} {reading.name}{v}")
    if not sensors:
        lines.append("  none found under " + args.root)
    _out(args, data, "\n".join(lines))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """``edge-sdk inspect``: print a package's manifest, variants, digests, and the variant selection for the profile with its reasons."""
    from .backends.base import all_backend_status
    from .package import ModelPackage
    from .profiles import resolve_profile
    from .selection import describe_machine, select_variant

    pkg = ModelPackage.open(args.package)
    m = pkg.manifest
    det = resolve_profile(args.profile, root=args.root)
    sel = select_variant(m, det.profile, all_backend_status(), memory_budget_mb=det.memory_budget_mb, machine=describe_machine(det.facts))
    lines = [
        f"{m.name} {m.version} ({m.task}) — {m.description}",
        f"manifest sha256 {pkg.manifest_sha256}; every variant's digest verified",
        "inputs:",
    ]
    for s in m.inputs:
        pre = f" preprocess {s.preprocess.resize} {s.preprocess.size_hw} {s.preprocess.color}" if s.preprocess else ""
        lines.append(f"  {s.name}: {s.dtype} {list(s.shape)} {s.layout or ''} dims={ {n: [lo, hi] for n, lo, hi in s.dim_bounds} }{pre}")
    lines.append("outputs:")
    for s in m.outputs:
        lines.append(f"  {s.name}: {s.dtype} {list(s.shape)}")
    lines.append(f"decoder: {m.decoder.kind}" + (f", labels {list(m.labels)}" if m.labels else ""))
    if m.generation is not None:
        g0 = m.generation
        lines.append(
            f"generation: {g0.architecture}, {g0.n_layers} layers, {g0.n_heads}/{g0.n_kv_heads} heads x {g0.head_dim}, vocab {g0.vocab_size}, "
            f"context {g0.context_length}; chat template {'yes' if g0.chat_template else 'no'}; eos {list(g0.eos_token_ids)}"
        )
    lines.append("variants:")
    for v in m.variants:
        q = v.quality
        qs = ""
        if q:
            parts = [f"{k}={getattr(q, k)}" for k in ("cosine", "top1_agreement") if getattr(q, k) is not None]
            if q.metric:
                parts.append(f"{q.metric}={q.value}")
            qs = " quality: " + ", ".join(parts)
        lines.append(f"  {v.id}: {v.backend} {v.precision} {v.file} {v.size} B sha256={v.sha256[:16]}…{' (reference)' if v.reference else ''}{qs}")
        g = v.generation
        if g is not None:
            gap = f" ({q.perplexity_gap:+.2%} vs reference)" if q and q.perplexity_gap is not None else ""
            ppl = f"; perplexity {q.perplexity:.3f}{gap}" if q and q.perplexity is not None else ""
            tm = f"; TTFT {g.ttft_ms} ms, TPOT {g.tpot_ms} ms on {g.bench_threads} threads" if g.tpot_ms is not None else ""
            mixed = f", {len(g.int8_tensors)} tensors int8" if g.int8_tensors else ""
            lines.append(
                f"      {g.bits}-bit {g.method or 'float'}{mixed}; KV {g.kv_bytes_per_token} B/token ({g.kv_dtype}); "
                f"{g.weight_bytes_per_token / 2**20:.1f} MiB of weights read per token{ppl}{tm}"
            )
    lines += ["", "selection:", sel.explain()]
    if sel.to_time:
        lines.append(
            f"(not proven by a measurement on this CPU class: `load` times {[sel.variant_id] + [c.variant_id for c in sel.to_time]} "
            "on this device once, caches the result, and keeps the fastest, the more precise within the noise margin)"
        )
    data = {"manifest": m.to_dict(), "manifest_sha256": pkg.manifest_sha256, "profile": det.profile.name, "selection": sel.to_dict()}
    _out(args, data, "\n".join(lines))
    return 0


def _load(args: argparse.Namespace, package: Any) -> Any:
    from .model import load_model

    return load_model(package, args.profile, **load_kwargs(args))


def _read_input(path: Path) -> tuple[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"input file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return "tensor", np.load(path, allow_pickle=False)
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return "tensor", {k: z[k] for k in z.files}
    return "image", path


def cmd_predict(args: argparse.Namespace) -> int:
    """``edge-sdk predict``: run a package on an image file or a ``.npy`` tensor (``--repeat N`` for latency percentiles) and print the
    result."""
    kind, x = _read_input(Path(args.input))
    if args.repeat < 1:
        print("edge-sdk: --repeat must be >= 1", file=sys.stderr)
        return 2
    with _load(args, args.package) as model:
        call: Callable[[], Any] = (
            (lambda: model.predict_image(x, top_k=args.top_k)) if kind == "image" else (lambda: model.predict(x, top_k=args.top_k))
        )
        results = [call() for _ in range(args.repeat)]
        r = results[-1]
        data = r.to_dict()
        data["selection"] = model.selection.to_dict()
        if model.options.deterministic:
            data["determinism"] = list(model.session.info.determinism)
        if model.result_cache is not None:
            data["result_cache"] = model.result_cache.stats()._asdict()
        lat = None
        if args.repeat > 1:
            lat = {k: _percentiles([getattr(x.timings, k) for x in results]) for k in ("total_ms", "inference_ms")}
            data["latency"] = lat
        lines = [f"{model.manifest.name} {model.manifest.version}: variant {r.variant_id} on {r.backend}"]
        if r.decoded is not None:
            for row in r.decoded:
                lines.append("  " + ", ".join(f"{c.label} {c.score:.3f}" for c in row))
        else:
            for k, v in r.outputs.items():
                lines.append(f"  {k}: {v.dtype} {list(v.shape)} {np.array2string(v.ravel()[:8], precision=4)}{' …' if v.size > 8 else ''}")
        t = r.timings
        lines.append(f"  timings ms: validate {t.validate_ms:.3f} preprocess {t.preprocess_ms:.3f} inference {t.inference_ms:.3f} decode {t.decode_ms:.3f} total {t.total_ms:.3f}")
        if lat:
            lines.append(f"  over {args.repeat} runs: total p50 {lat['total_ms']['p50']} p90 {lat['total_ms']['p90']} p99 {lat['total_ms']['p99']} ms")
        _out(args, data, "\n".join(lines))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``edge-sdk demo``: run the bundled shapes classifier on its sample images and print the selection, results and timings."""
    from .assets import demo_package_path, demo_samples

    if args.runs < 1:
        print("edge-sdk: --runs must be >= 1", file=sys.stderr)
        return 2
    samples = demo_samples()
    with _load(args, demo_package_path()) as model:
        det = model.detection
        d = model.describe()
        lines = ["== device", det.explain(), "", "== selection", model.selection.explain()]
        lines.append(f"running {d['variant']} on {d['runtime']}, threads={d['threads']}" + (f", providers={d['providers']}" if d["providers"] else "") + (f", delegates={d['delegates']}" if d["delegates"] else ""))
        for n in d["notes"]:
            lines.append(f"note: {n}")
        q = model.variant.quality
        if q:
            lines.append(f"variant quality (from the package): {q.metric}={q.value}" + (f", cosine={q.cosine}, top1_agreement={q.top1_agreement} vs {q.reference}" if q.cosine is not None else "") + f" on {q.dataset}")
        lines += ["", f"== results on {len(samples)} bundled images"]
        rows = []
        correct = 0
        for p in samples:
            r = model.predict_image(p)
            truth = p.stem.rsplit("_", 1)[0]
            ok = r.top1.label == truth
            correct += ok
            rows.append({"image": p.name, "truth": truth, "top": [(c.label, round(c.score, 4)) for c in r.decoded[0]], "correct": ok})
            alt = ", ".join(f"{c.label} {c.score:.2f}" for c in r.decoded[0][1:])
            lines.append(f"  {p.name:16s} -> {r.top1.label:9s} {r.top1.score:.3f} {'ok ' if ok else 'MISS'}  ({alt})")
        lines.append(f"  {correct}/{len(samples)} correct")
        # latency: the whole predict_image path on one image held in memory
        from .processing.image import load_image

        img = load_image(samples[0])
        for _ in range(5):
            model.predict_image(img)
        res = [model.predict_image(img) for _ in range(args.runs)]
        stages = ("preprocess_ms", "validate_ms", "inference_ms", "decode_ms", "total_ms")
        lat = {k: _percentiles([getattr(r.timings, k) for r in res]) for k in stages}
        lines += ["", f"== latency over {args.runs} runs (ms)", f"  {'stage':14s} {'p50':>8s} {'p90':>8s} {'p99':>8s}"]
        for k in stages:
            v = lat[k]
            lines.append(f"  {k[:-3]:14s} {v['p50']:8.3f} {v['p90']:8.3f} {v['p99']:8.3f}")
        data = {"device": {"profile": det.profile.name, "source": det.source, "reasons": list(det.reasons)}, "model": d, "results": rows, "correct": correct, "latency_ms": lat}
        _out(args, data, "\n".join(lines))
    return 0


def cmd_monitor(args: argparse.Namespace) -> int:
    """``edge-sdk monitor``: live temperatures, throttled flags, power rails and governor state, from this device's sensors or from
    ``--url`` (see :mod:`edge_sdk.budget.command`)."""
    from .budget.command import run

    profile = None
    if args.url is None:
        from .profiles import resolve_profile

        profile = resolve_profile(args.profile, root=args.root).profile
    return run(args, profile)


def cmd_serve(args: argparse.Namespace) -> int:
    """``edge-sdk serve``: serve packages over the KServe v2 protocol (see :mod:`edge_sdk.serve.command`)."""
    from .serve.command import run

    return run(args)


def cmd_generate(args: argparse.Namespace) -> int:
    """``edge-sdk generate``: stream a completion (see :mod:`edge_sdk.generation.command`)."""
    from .generation.command import decoder_load_kwargs, run_generate
    from .model import load_decoder

    return run_generate(load_decoder(args.package, args.profile, **decoder_load_kwargs(args)), args)


def cmd_chat(args: argparse.Namespace) -> int:
    """``edge-sdk chat``: an interactive chat (see :mod:`edge_sdk.generation.command`)."""
    from .generation.command import decoder_load_kwargs, run_chat
    from .model import load_decoder

    return run_chat(load_decoder(args.package, args.profile, **decoder_load_kwargs(args)), args)


def cmd_models(args: argparse.Namespace) -> int:
    """``edge-sdk models``: manage a model store (see :mod:`edge_sdk.store.command`)."""
    from .store.command import run

    return run(args)


def cmd_run(args: argparse.Namespace) -> int:
    """``edge-sdk run``: a package over a camera, video, stream or folder (see :mod:`edge_sdk.pipelines.run_command`)."""
    from .pipelines.run_command import run

    return run(args)


def cmd_bench(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """``edge-sdk bench``: run the benchmark scenarios (see :mod:`edge_sdk.bench.command`)."""
    from .bench.command import run

    return run(args, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
