"""Cold start: package open + first inference, in a fresh Python process each time.

The parent (:func:`measure_cold_start`) runs ``python -m edge_sdk.bench.coldstart SPEC`` where SPEC
is JSON (package, variant, cache_dir, profile, threads, input mode, seed). The child times, with
``perf_counter``: ``import_ms`` (numpy and edge_sdk's loading code), ``open_ms``
(``ModelPackage.open``: manifest and digest checks, extraction of an archive into the cache),
``load_ms`` (``edge_sdk.load``: profile, selection, session creation -- the ONNX Runtime graph
optimisation, or the cached optimised model), ``first_inference_ms`` (the first
``predict_image``/``predict``) and prints one JSON line. ``cold_start_ms`` = open + load + first
inference. The parent adds ``process_ms``: spawn to exit, interpreter start-up included.

Cache states: ``clear`` runs get a new, empty cache folder; ``warm`` runs reuse a folder a clear
run filled. The order alternates (clear, warm, clear, warm, ...); the first clear run is the one
that fills the warm folder. What the session did with the cache is its own report
(``optimized_cache``: "written <file>", "hit <file>"; None for LiteRT, which has no such
cache); ``cache_used`` is True only for a hit whose file exists. Files stay in the OS page cache
between runs (a warm disk): this measures software start-up, not storage.
"""

from __future__ import annotations

import time

_T_START = time.perf_counter()

import contextlib  # noqa: E402  (after the start time on purpose)
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Sequence  # noqa: E402

__all__ = ["measure_cold_start"]

CHILD_TIMEOUT_S = 180.0


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    import numpy as np  # noqa: F401

    from edge_sdk.model import LoadOptions, load_model
    from edge_sdk.package import ModelPackage

    t1 = time.perf_counter()
    cache = Path(spec["cache_dir"])
    pkg = ModelPackage.open(spec["package"], cache_dir=cache)
    t2 = time.perf_counter()
    opts = LoadOptions(
        variant=spec["variant"], threads=spec.get("threads"), cache_dir=cache, measure_backends=False, root=spec.get("root", "/")
    )
    model = load_model(pkg, spec.get("profile"), opts)
    t3 = time.perf_counter()
    from edge_sdk.bench.targets import InputPool, image_spec_of

    mode = spec["input_mode"]
    pool = InputPool(mode, 1, spec["seed"], tuple(spec["image_hw"]) if spec.get("image_hw") else None)
    if mode == "image":
        spec_in = image_spec_of(model.inputs)
        assert spec_in is not None
        img = pool.images(spec_in)[0]
        t4 = time.perf_counter()
        model.predict_image(img)
    else:
        feeds = pool.tensors(model.inputs)[0]
        t4 = time.perf_counter()
        model.predict(feeds)
    t5 = time.perf_counter()
    info = model.session.info
    state = info.optimized_cache
    cache_file = state.split(" ", 2)[1] if state and state.startswith(("hit ", "written ")) else None
    out = {
        "variant": model.variant.id,
        "backend": info.backend,
        "interpreter_to_main_ms": (t0 - _T_START) * 1e3,
        "import_ms": (t1 - t0) * 1e3,
        "open_ms": (t2 - t1) * 1e3,
        "load_ms": (t3 - t2) * 1e3,
        "session_create_ms": info.create_ms,
        "first_inference_ms": (t5 - t4) * 1e3,
        "cold_start_ms": (t2 - t1 + t3 - t2 + t5 - t4) * 1e3,
        "optimized_cache": state,
        "cache_file": cache_file,
        "cache_file_exists": bool(cache_file and Path(cache_file).is_file()),
    }
    out["cache_used"] = bool(state and state.startswith("hit ") and out["cache_file_exists"])
    model.close()
    return out


def _run_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    from .options import BenchError

    env = dict(os.environ)
    env.pop("EDGE_SDK_CACHE", None)  # the spec's cache_dir decides
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "edge_sdk.bench.coldstart", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"cold start of {spec['variant']}: the child process ran past {timeout_s:g} s") from e
    wall = (time.perf_counter() - t0) * 1e3
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise BenchError(f"cold start of {spec['variant']} failed (exit {p.returncode}): {' | '.join(tail)}")
    out: dict[str, Any] = json.loads(lines[-1])
    out["process_ms"] = wall
    return out


def measure_cold_start(
    package: str,
    variant: str,
    *,
    samples: int,
    input_mode: str,
    seed: int,
    profile: str | None = None,
    threads: int | None = None,
    image_hw: Sequence[int] | None = None,
    root: str = "/",
    work_dir: str | os.PathLike[str] | None = None,
    timeout_s: float = CHILD_TIMEOUT_S,
) -> dict[str, list[dict[str, Any]]]:
    """``samples`` clear-cache and ``samples`` warm-cache cold starts of ``variant`` (module docs).
    Returns ``{"clear": [...], "warm": [...]}``, one dict per child. The cache folders live in a
    temporary folder, removed afterwards, or under ``work_dir`` (kept: the caller's). Raises
    BenchError."""
    base = {
        "package": str(package), "variant": variant, "profile": profile, "threads": threads, "input_mode": input_mode,
        "seed": seed, "image_hw": list(image_hw) if image_hw else None, "root": root,
    }  # fmt: skip
    out: dict[str, list[dict[str, Any]]] = {"clear": [], "warm": []}
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="edge-bench-cold-"))
        else:
            tmp = tempfile.mkdtemp(prefix=f"cold-{variant}-", dir=work_dir)
        warm = Path(tmp) / "warm"
        for i in range(samples):
            order = ("clear", "warm") if i % 2 == 0 else ("warm", "clear")
            for state in order:
                if state == "clear":
                    cache = warm if i == 0 else Path(tmp) / f"clear-{i}"
                else:
                    cache = warm
                out[state].append(_run_child({**base, "cache_dir": str(cache)}, timeout_s))
    return out


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
