"""Per-call overhead of ``Model.predict`` at two revisions, side by side in one process.

A refactor must not make ``predict`` slower, but two runs of ``bench_overhead.py`` on a shared
2-core box differ by more than a regression worth catching. This puts both revisions in one
process: ``git archive BASE`` is unpacked into a temporary folder with the package renamed
``edge_sdk_base`` (every ``edge_sdk`` name in its sources rewritten), the working tree is imported
as ``edge_sdk``, and the arms run interleaved call by call, the order rotating every round:

- ``raw``: ``onnxruntime.InferenceSession.run`` on a trivial model (1x16 Add);
- ``head_a`` / ``head_b`` / ``base_a`` / ``base_b``: ``Model.predict`` on that model (raw
  decoder), two independent instances per revision, loaded alternately;
- ``*_demo_a`` / ``*_demo_b``: ``Model.predict`` of the demo classifier (fp32 ONNX, softmax + top-k).

Instances of the *same* code differ by up to ~10 us per call here (the session's memory, its
place in the process), so each revision is the mean of its two instances, and the difference
between a revision's own two instances is the *null*: a head - base difference inside it is no
difference. Reported: medians (us) per arm, each revision's added overhead over ``raw``, the
paired per-round medians head - base, and the null pairs. Usage::

    python tools/bench/bench_revisions.py --base a8daf1d [--rounds 40] [--calls 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from edge_sdk.bench.machine import finish_record, machine_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def unpack_base(rev: str, dest: Path) -> Path:
    """``git archive rev edge_sdk device_profiles`` into ``dest``, the package renamed edge_sdk_base."""
    data = subprocess.run(["git", "archive", rev, "edge_sdk", "device_profiles"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    (dest / "edge_sdk").rename(dest / "edge_sdk_base")
    word = re.compile(r"\bedge_sdk\b")
    for p in (dest / "edge_sdk_base").rglob("*.py"):
        p.write_text(word.sub("edge_sdk_base", p.read_text(encoding="utf-8")), encoding="utf-8")
    return dest


def trivial_onnx() -> bytes:
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "trivial",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def cpu_line() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), [])
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags]
    return f"{model} ({os.cpu_count()} CPUs; {', '.join(simd) or 'no avx2'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--base", required=True, help="the revision to compare the working tree against (a commit, tag or branch)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=200, help="calls of every arm per round")
    ap.add_argument("--json", type=Path, metavar="OUT")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="edge-bench-rev-"))
    unpack_base(args.base, work / "base")
    sys.path.insert(0, str(work / "base"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(work / "base"), str(ROOT), os.environ.get("PYTHONPATH", "")])  # the sandbox child
    import edge_sdk_base  # type: ignore[import-not-found]
    import numpy as np
    import onnxruntime as ort

    import edge_sdk
    from converters.packaging import write_package

    write_package(
        work / "trivial",
        {
            "schema": 1, "name": "trivial", "version": "1", "task": "raw", "decoder": {"kind": "raw"},
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 16]}], "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 16]}],
            "variants": [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },  # fmt: skip
        {"m.onnx": trivial_onnx()},
    )
    demo = edge_sdk.demo_package_path()
    kw: dict[str, Any] = {"threads": 1}
    models: dict[str, Any] = {}
    for inst in ("a", "b"):  # two instances of each: the spread between them is the null
        for rev, sdk in (("head", edge_sdk), ("base", edge_sdk_base)):  # loaded alternately: no revision always first
            n = len(models)
            models[f"{rev}_{inst}"] = sdk.load(work / "trivial", "generic-x86_64", cache_dir=str(work / f"c{n}"), **kw)
            models[f"{rev}_demo_{inst}"] = sdk.load(demo, "generic-x86_64", cache_dir=str(work / f"d{n}"), variant="fp32-onnx", **kw)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    raw = ort.InferenceSession(trivial_onnx(), so, providers=["CPUExecutionProvider"])
    x = np.ones((1, 16), np.float32)
    img = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    arms: dict[str, Callable[[], Any]] = {"raw": lambda: raw.run(None, {"x": x})}
    for name, m in models.items():
        arms[name] = (lambda m=m, a=(img if "demo" in name else x): m.predict(a))
    load_before = os.getloadavg()
    machine = machine_record()
    pc = time.perf_counter_ns
    for f in arms.values():  # warm-up
        for _ in range(500):
            f()
    names = list(arms)
    per_round: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        t: dict[str, list[int]] = {k: [] for k in names}
        for _ in range(args.calls):
            for k in order:
                s = pc()
                arms[k]()
                t[k].append(pc() - s)
        for k in names:
            per_round[k].append(statistics.median(t[k]) / 1e3)

    def per_rev(rev: str) -> list[float]:  # per round: the mean of the revision's two instances
        return [(x + y) / 2 for x, y in zip(per_round[f"{rev}_a"], per_round[f"{rev}_b"])]

    def paired(a: list[float], b: list[float]) -> float:
        return round(statistics.median(x - y for x, y in zip(a, b)), 2)

    med = {k: round(statistics.median(v), 2) for k, v in per_round.items()}
    head, base = per_rev("head"), per_rev("base")
    head_d, base_d = per_rev("head_demo"), per_rev("base_demo")
    out = {
        "base": args.base,
        "head": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() + "+worktree",
        "cpu": cpu_line(), "python": platform.python_version(), "onnxruntime": ort.__version__,
        "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in os.getloadavg()],
        "rounds": args.rounds, "calls_per_round": args.calls, "median_us": med, "machine_record": finish_record(machine),
        "added_over_raw_us": {rev: round(statistics.median(v) - med["raw"], 2) for rev, v in (("base", base), ("head", head))},
        "paired_us": {"trivial head - base": paired(head, base), "demo head - base": paired(head_d, base_d)},
        "null_us": {
            "trivial head_b - head_a": paired(per_round["head_b"], per_round["head_a"]),
            "trivial base_b - base_a": paired(per_round["base_b"], per_round["base_a"]),
            "demo head_b - head_a": paired(per_round["head_demo_b"], per_round["head_demo_a"]),
            "demo base_b - base_a": paired(per_round["base_demo_b"], per_round["base_demo_a"]),
        },
    }  # fmt: skip
    for m in models.values():
        m.close()
    print(f"# Model.predict, {out['head']} vs {args.base}: {out['cpu']}, load {out['load_before']} -> {out['load_after']}")
    print(f"median us per call: {json.dumps(med)}")
    print(f"added over raw ORT (trivial): base {out['added_over_raw_us']['base']} us, head {out['added_over_raw_us']['head']} us")
    print(f"paired head - base: {json.dumps(out['paired_us'])}; null (same code, another instance): {json.dumps(out['null_us'])}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
