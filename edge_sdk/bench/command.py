"""The ``edge-sdk bench`` subcommand: arguments and the run (``edge_sdk/cli.py`` stays thin).

    edge-sdk bench PACKAGE [--variant V ...|--all-variants] [--scenario S ...|all] [--vs-raw] [--json F] [--plot F.png] ...
    edge-sdk bench --compare A.json B.json [--min-effect F] [--json F]
    edge-sdk bench TEXT-GENERATION-PACKAGE [--prompt-tokens P] [--new-tokens G] [--runs N] [--threads T] [--vs-raw] [--json F]
    edge-sdk bench TEXT-GENERATION-PACKAGE --scenario offline|multi-stream|server|all [--streams 1,2,4,8] [--requests N] ...

A text-generation package (``task = "text-generation"``) runs :mod:`edge_sdk.bench.generation`
instead of the scenarios: TTFT, TPOT, tokens/s, memory, and with ``--vs-raw`` onnxruntime-genai
on the same file. With ``--scenario offline``, ``multi-stream`` (or ``multistream``) or ``server``
it runs :mod:`edge_sdk.bench.generation_load` instead: the generation engine under load, after
MLPerf Inference's LLM scenarios (``all``: the three; ``single-stream``: the plain bench above).

Exit codes: 0 done, 1 an edge_sdk error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from .options import INPUT_MODES, SCENARIOS

__all__ = ["add_arguments", "run"]


def _hw(text: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW (e.g. 480x640), got {text!r}") from None
    return h, w


def _streams(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a stream count or a comma-separated list (e.g. 1,2,4,8), got {text!r}") from None
    if not out or any(x < 1 for x in out):
        raise argparse.ArgumentTypeError(f"expected stream counts >= 1, got {text!r}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench options (defaults are BenchOptions' own)."""
    p.add_argument("package", nargs="?", help="model package (folder or archive); not with --compare")
    g = p.add_argument_group("what to measure")
    g.add_argument(
        "--variant", action="append", default=[], metavar="V", help="variant id (repeat to compare several; default: the one load selects)"
    )
    g.add_argument("--all-variants", action="store_true", help="every variant whose runtime is installed, side by side")
    g.add_argument(
        "--scenario", action="append", default=[], metavar="S",
        help=f"{', '.join(SCENARIOS)} or all (repeat or comma-separate; default single-stream)",
    )  # fmt: skip
    g.add_argument(
        "--vs-raw", action="store_true", help="add each variant's bytes in the bare runtime (same threads) and report the SDK's overhead"
    )
    g = p.add_argument_group("text-generation packages (edge_sdk.bench.generation)")
    g.add_argument("--prompt-tokens", type=int, metavar="P", help="random prompt of P token ids from --seed (default 64)")
    g.add_argument("--prompt", metavar="TEXT", help="this prompt text instead of random ids")
    g.add_argument("--new-tokens", type=int, metavar="G", help="tokens generated per run, greedy, ignore_eos (default 64)")
    g.add_argument("--runs", type=int, metavar="N", help="measured generations per variant and runtime (default 5)")
    g.add_argument("--context", type=int, metavar="N", help="KV tokens to allocate (default: what load plans)")
    g.add_argument("--no-memory", action="store_true", help="skip the peak-RSS child processes")
    g = p.add_argument_group(
        "text-generation packages under load: --scenario offline, multi-stream, server or all (edge_sdk.bench.generation_load)"
    )
    g.add_argument("--requests", type=int, metavar="N", help="offline: requests submitted at once (default 16)")
    g.add_argument(
        "--requests-per-stream", type=int, metavar="R", help="multi-stream: requests per closed-loop client and stream count (default 4)"
    )
    g.add_argument(
        "--time-limit-s", type=float, metavar="S",
        help="multi-stream: no new request after S seconds per stream count; server: no arrival after S s per trial (default 120)",
    )  # fmt: skip
    g.add_argument(
        "--probe-runs", type=int, metavar="N", help="multi-stream: TTFT probes idle and as many while 3 streams decode (default 5)"
    )
    g.add_argument("--trial-requests", type=int, metavar="N", help="server: Poisson arrivals per trial (default 32)")
    g.add_argument("--ttft-p99-ms", type=float, metavar="MS", help="server: TTFT p99 constraint (default 2000, MLPerf's LLM server)")
    g.add_argument("--tpot-p99-ms", type=float, metavar="MS", help="server: TPOT p99 constraint (default 200, MLPerf's LLM server)")
    g.add_argument("--queue-size", type=int, metavar="N", help="engine: requests waiting beyond the running ones (default 16)")
    g.add_argument("--no-prefix-cache", action="store_true", help="engine: no prefix cache")
    g.add_argument("--speculative", choices=["prompt-lookup"], help="engine: speculative decoding (default off)")
    g = p.add_argument_group("bounds and inputs")
    g.add_argument("--duration-s", type=float, default=5.0, metavar="S", help="measured seconds per target and scenario (default 5)")
    g.add_argument("--count", type=int, metavar="N", help="at most N queries per target and scenario (offline: exactly N)")
    g.add_argument(
        "--repetitions", type=int, default=5, metavar="R", help="interleaved blocks per target (the comparison's noise estimate; default 5)"
    )
    g.add_argument(
        "--warmup", type=int, default=10, metavar="N", help="warm-up queries per target and scenario, excluded and reported (default 10)"
    )
    g.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the inputs and of the server's arrivals (default 0)")
    g.add_argument("--input", choices=INPUT_MODES, default="auto", help="image frames via predict_image, model-ready tensors, or auto")
    g.add_argument("--pool", type=int, default=16, metavar="N", help="distinct inputs generated (default 16)")
    g.add_argument("--image-size", type=_hw, metavar="HxW", help="frame size in image mode (default: the input's preprocess size)")
    g = p.add_argument_group("loading")
    g.add_argument("--profile", metavar="P", help="device profile name or .toml path (default: $EDGE_SDK_PROFILE or detected)")
    g.add_argument("--root", default="/", metavar="DIR", help="read /proc and /sys from this root (default: /)")
    g.add_argument("--threads", type=int, metavar="N", help="override the profile's thread count")
    g.add_argument("--cache-dir", metavar="DIR", help="cache folder for packages and optimised models (default: the SDK's)")
    g = p.add_argument_group("multi-stream")
    g.add_argument(
        "--streams", type=_streams, metavar="N",
        help="streams (default 4); text-generation --scenario: engine slots, multi-stream runs each of a list such as 1,2,4,8 "
        "(default 1,2,4,8; offline and server use the largest, default 4)",
    )  # fmt: skip
    g.add_argument("--fps", type=float, default=30.0, metavar="F", help="frames per second per stream (default 30)")
    g.add_argument("--deadline-ms", type=float, metavar="MS", help="a frame is late past this (default: one frame period)")
    g = p.add_argument_group("server")
    g.add_argument(
        "--rate",
        type=float,
        metavar="QPS",
        help="Poisson arrival rate for every target (default: 80%% of the lowest rate meeting the objective the search finds)",
    )
    g.add_argument("--objective-ms", type=float, default=15.0, metavar="MS", help="latency objective (default 15 ms)")
    g.add_argument("--objective-percentile", type=float, default=99.0, metavar="P", help="percentile held to the objective (default 99)")
    g.add_argument("--no-search", action="store_true", help="skip the search for the highest rate meeting the objective (needs --rate)")
    g.add_argument("--probe-s", type=float, default=1.0, metavar="S", help="seconds per search probe (default 1)")
    g.add_argument("--max-probes", type=int, default=10, metavar="N", help="search probes at most (default 10)")
    g.add_argument("--max-rate", type=float, default=20000.0, metavar="QPS", help="the search never goes above (default 20000)")
    g.add_argument("--server-workers", type=int, default=1, metavar="N", help="queries served at once (default 1)")
    g = p.add_argument_group("offline")
    g.add_argument("--offline-batch", type=int, metavar="N", help="rows per predict_batch call (default: the model's largest batch)")
    g.add_argument(
        "--offline-workers", type=int, metavar="N", help="worker threads when the model has no dynamic batch (default: one per CPU)"
    )
    g = p.add_argument_group("remote")
    g.add_argument(
        "--remote", metavar="URL", help="also measure the package served at URL (Open Inference Protocol); sends the generated inputs"
    )
    g.add_argument("--remote-token-env", metavar="VAR", help="bearer token for --remote from this environment variable")
    g = p.add_argument_group("cold start and monitoring")
    g.add_argument("--no-cold-start", action="store_true", help="skip the fresh-process cold starts")
    g.add_argument(
        "--cold-samples", type=int, default=3, metavar="N", help="fresh processes per cache state (clear / warm) and variant (default 3)"
    )
    g.add_argument(
        "--sample-interval-s", type=float, default=0.5, metavar="S", help="sensor / governor / CPU sampling period (default 0.5)"
    )
    g.add_argument(
        "--keep-samples", type=int, default=1000, metavar="N", help="latency samples kept per target and scenario for plots (default 1000)"
    )
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the report (schema: edge_sdk/bench/schema.json) or the comparison here")
    g.add_argument("--plot", metavar="FILE.png", help="latency distributions and a latency/temperature time series (needs matplotlib)")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    g.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="compare two reports instead of running")
    g.add_argument(
        "--min-effect", type=float, default=0.05, metavar="F", help="--compare: smallest relative change called significant (default 0.05)"
    )


def _scenarios(values: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for v in values or ["single-stream"]:
        for s in v.split(","):
            s = s.strip()
            if s == "all":
                out += [x for x in SCENARIOS if x not in out]
            elif s and s not in out:
                out.append(s)
    return tuple(x for x in SCENARIOS if x in out) + tuple(x for x in out if x not in SCENARIOS)


def _usage(msg: str) -> int:
    print(f"edge-sdk bench: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run the subcommand for parsed ``args``."""
    if args.compare:
        return _compare(args)
    if not args.package:
        return _usage("PACKAGE is required (or --compare A.json B.json)")
    gen = _generation_args(args)
    if _is_text_generation(args.package, args.cache_dir):
        return _generation(args, argv)
    if gen:
        return _usage(f"{', '.join(gen)} apply to text-generation packages only")
    if args.streams is not None and len(args.streams) != 1:
        return _usage("--streams takes one number for a single-pass package (a list is for text-generation --scenario multi-stream)")
    streams = args.streams[0] if args.streams is not None else 4
    if args.no_search and args.rate is None and "server" in _scenarios(args.scenario):
        return _usage("--no-search needs --rate for the server scenario")
    from .options import BenchOptions

    try:
        opts = BenchOptions(
            scenarios=_scenarios(args.scenario), variants=tuple(args.variant), all_variants=args.all_variants, vs_raw=args.vs_raw,
            duration_s=args.duration_s, count=args.count, repetitions=args.repetitions, warmup=args.warmup, seed=args.seed,
            input_mode=args.input, pool=args.pool, image_hw=args.image_size, profile=args.profile, threads=args.threads,
            cache_dir=args.cache_dir, root=args.root, streams=streams, fps=args.fps, deadline_ms=args.deadline_ms, rate_qps=args.rate,
            objective_ms=args.objective_ms, objective_percentile=args.objective_percentile, search=not args.no_search, probe_s=args.probe_s,
            max_probes=args.max_probes, max_rate_qps=args.max_rate, server_workers=args.server_workers, offline_batch=args.offline_batch,
            offline_workers=args.offline_workers, cold_start=not args.no_cold_start, cold_samples=args.cold_samples,
            sample_interval_s=args.sample_interval_s, keep_samples=args.keep_samples, remote_url=args.remote,
            remote_token_env=args.remote_token_env,
        )  # fmt: skip
    except ValueError as e:
        return _usage(str(e))
    if args.plot:
        from .plot import _pyplot

        _pyplot()  # fail before a long run when matplotlib is missing
    from .report import render_text, validate_report, write_json
    from .runner import run_bench

    progress = None if args.quiet else (lambda line: print(f"bench: {line}", file=sys.stderr, flush=True))
    report = run_bench(args.package, opts, argv=list(argv) if argv is not None else sys.argv[1:], progress=progress)
    validate_report(report)
    sys.stdout.write(render_text(report))
    if args.json:
        print(f"report: {write_json(report, args.json)}")
    if args.plot:
        from .plot import write_plot

        print(f"plot: {write_plot(report, args.plot)}")
    return 0


_GEN_ONLY = {
    "prompt_tokens": "--prompt-tokens",
    "prompt": "--prompt",
    "new_tokens": "--new-tokens",
    "runs": "--runs",
    "context": "--context",
}
_LOAD_ONLY = {
    "requests": "--requests",
    "requests_per_stream": "--requests-per-stream",
    "time_limit_s": "--time-limit-s",
    "probe_runs": "--probe-runs",
    "trial_requests": "--trial-requests",
    "ttft_p99_ms": "--ttft-p99-ms",
    "tpot_p99_ms": "--tpot-p99-ms",
    "queue_size": "--queue-size",
    "speculative": "--speculative",
}
_NOT_GEN = {"scenario": "--scenario", "plot": "--plot", "remote": "--remote", "count": "--count", "rate": "--rate"}
_NOT_LOAD = {"plot": "--plot", "remote": "--remote", "count": "--count", "runs": "--runs", "vs_raw": "--vs-raw", "no_memory": "--no-memory"}


def _load_args(args: argparse.Namespace) -> list[str]:
    out = [flag for k, flag in _LOAD_ONLY.items() if getattr(args, k, None) is not None]
    return out + (["--no-prefix-cache"] if getattr(args, "no_prefix_cache", False) else [])


def _generation_args(args: argparse.Namespace) -> list[str]:
    out = [flag for k, flag in _GEN_ONLY.items() if getattr(args, k, None) is not None]
    return out + (["--no-memory"] if getattr(args, "no_memory", False) else []) + _load_args(args)


def _generation_scenarios(values: Sequence[str]) -> tuple[str, ...]:
    """The load scenarios asked for on a text-generation package; () for the plain (single-stream)
    bench. ValueError naming what is accepted."""
    from .generation_load import LOAD_SCENARIOS, canonical_scenario

    names = [s.strip() for v in values for s in v.split(",") if s.strip()]
    if not names or names == ["single-stream"] * len(names):
        return ()
    if "single-stream" in names:
        raise ValueError("--scenario single-stream is the plain text-generation bench (no --scenario); run it on its own")
    out: list[str] = []
    for s in names:
        for x in LOAD_SCENARIOS if s == "all" else (canonical_scenario(s),):
            if x not in out:
                out.append(x)
    return tuple(out)


def _is_text_generation(package: str, cache_dir: str | None) -> bool:
    """Whether ``package`` is a text-generation package (a folder's manifest is read; an archive is
    opened the way ``load`` opens it). Anything unreadable is left to the single-pass path's errors."""
    from pathlib import Path

    from ..errors import EdgeSDKError
    from ..package import ModelPackage, default_cache_dir

    try:
        pkg = ModelPackage.open(package, cache_dir=Path(cache_dir) if cache_dir else default_cache_dir(), verify=False)
    except (EdgeSDKError, OSError):
        return False
    return pkg.manifest.task == "text-generation"


def _generation(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from . import generation as gb

    try:
        load = _generation_scenarios(args.scenario)
    except ValueError as e:
        return _usage(f"{e} (text-generation --scenario: offline, multi-stream, server, all or single-stream)")
    if load:
        return _generation_load(args, argv, load)
    extra = _load_args(args) + [f for f, on in (("--streams", args.streams is not None), ("--rate", args.rate is not None),
                                                 ("--no-search", args.no_search)) if on]  # fmt: skip
    if extra:
        return _usage(f"{', '.join(extra)} apply to --scenario offline, multi-stream or server on a text-generation package")
    bad = [flag for k, flag in _NOT_GEN.items() if k not in ("scenario", "rate") and getattr(args, k)]
    if bad:
        return _usage(f"{', '.join(bad)} apply to single-pass packages; {args.package} is a text-generation package")
    try:
        opts = gb.GenerationBenchOptions(
            variants=tuple(args.variant), all_variants=args.all_variants,
            prompt_tokens=args.prompt_tokens if args.prompt_tokens is not None else gb.DEFAULT_PROMPT_TOKENS,
            new_tokens=args.new_tokens if args.new_tokens is not None else gb.DEFAULT_NEW_TOKENS,
            runs=args.runs if args.runs is not None else gb.DEFAULT_RUNS, prompt=args.prompt, seed=args.seed, threads=args.threads,
            vs_raw=args.vs_raw, memory=not args.no_memory, context=args.context, profile=args.profile, root=args.root,
            cache_dir=args.cache_dir,
        )  # fmt: skip
    except ValueError as e:
        return _usage(str(e))
    return _report(args, argv, opts, gb.run_generation_bench, gb.render_generation_text, gb.write_generation_json)


def _generation_load(args: argparse.Namespace, argv: Sequence[str] | None, scenarios: tuple[str, ...]) -> int:
    from . import generation_load as gl

    bad = [flag for k, flag in _NOT_LOAD.items() if getattr(args, k)] + (["--all-variants"] if args.all_variants else [])
    if bad:
        return _usage(f"{', '.join(bad)} do not apply to text-generation --scenario {','.join(scenarios)}")
    if len(args.variant) > 1:
        return _usage("text-generation --scenario measures one variant: give at most one --variant")
    if args.no_search and args.rate is None and "server" in scenarios:
        return _usage("--no-search needs --rate for the server scenario")
    given = {k: getattr(args, k) for k in ("requests", "requests_per_stream", "time_limit_s", "probe_runs", "trial_requests",
                                           "ttft_p99_ms", "tpot_p99_ms", "queue_size", "prompt_tokens", "new_tokens", "context")}  # fmt: skip
    try:
        opts = gl.GenerationLoadOptions(
            scenarios=scenarios, variant=args.variant[0] if args.variant else None, streams=args.streams,
            rate=args.rate, search=not args.no_search, max_trials=args.max_probes, max_rate=args.max_rate, prompt=args.prompt,
            seed=args.seed, prefix_cache=not args.no_prefix_cache, speculative=args.speculative, threads=args.threads,
            profile=args.profile, root=args.root, cache_dir=args.cache_dir, **{k: v for k, v in given.items() if v is not None},
        )  # fmt: skip
    except ValueError as e:
        return _usage(str(e))
    return _report(args, argv, opts, gl.run_generation_load, gl.render_generation_load_text, gl.write_generation_load_json)


def _report(
    args: argparse.Namespace, argv: Sequence[str] | None, opts: Any,
    run: Callable[..., dict[str, Any]], render: Callable[[dict[str, Any]], str], write: Callable[[dict[str, Any], str], Any],
) -> int:
    """Run a text-generation bench with progress on stderr (unless --quiet), print its text report and, with
    --json, write the JSON one."""
    progress = None if args.quiet else (lambda line: print(f"bench: {line}", file=sys.stderr, flush=True))
    report = run(args.package, opts, argv=list(argv) if argv is not None else sys.argv[1:], progress=progress)
    sys.stdout.write(render(report))
    if args.json:
        print(f"report: {write(report, args.json)}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare_reports, render_comparison
    from .report import read_json

    if args.package:
        return _usage("--compare takes two reports, not a PACKAGE")
    a_path, b_path = args.compare
    a, b = read_json(a_path), read_json(b_path)
    try:
        c = compare_reports(a, b, min_effect=args.min_effect)
    except ValueError as e:
        return _usage(str(e))
    sys.stdout.write(render_comparison(c, "A", "B"))
    if args.json:
        from pathlib import Path

        Path(args.json).write_text(json.dumps(c, indent=1) + "\n", encoding="utf-8")
        print(f"comparison: {args.json}")
    return 0
