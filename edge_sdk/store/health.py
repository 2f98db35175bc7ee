"""The health check a new version must pass before it becomes active.

Runs in a child process bounded by a wall-clock limit, so a model that hangs,
aborts or segfaults the runtime cannot take the updater down. The child loads
the package with :func:`edge_sdk.load`, then runs the manifest's ``[golden]``
inputs and compares them with the expected outputs (``allclose`` with the
manifest's ``atol``/``rtol``) and the best of a few timed calls with
``max_latency_ms``; a package without ``[golden]`` must load and run once on
zeros. ``start_method``: ``"spawn"`` (a fresh ``python -m edge_sdk.store.health``,
the default) or ``"fork"`` (faster; only from a process that has not started
runtime threads).

    python -m edge_sdk.store.health PACKAGE_DIR   # prints one JSON line
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OptionsError

TIMED_CALLS = 5


@dataclass(frozen=True)
class HealthResult:
    """``ok``; why not (``reason``); the best latency seen (ms); the check's wall time (s)."""

    ok: bool
    reason: str = ""
    latency_ms: float | None = None
    wall_s: float = 0.0


def check_package(package_dir: str | Path) -> dict[str, Any]:
    """Load and exercise a package in this process; a JSON-able verdict."""
    import numpy as np

    from ..model import load_decoder, load_model
    from ..package import ModelPackage

    pkg = ModelPackage.open(package_dir)
    g = pkg.manifest.golden
    if pkg.manifest.task == "text-generation":
        # A decoder's health: it loads, and greedy decoding of a short prompt yields tokens.
        with load_decoder(pkg, measure_backends=False) as dec:
            t0 = time.perf_counter()
            r = dec.generate("Hello", max_new_tokens=4, ignore_eos=True)
            if len(r.token_ids) != 4:
                return {"ok": False, "reason": f"generation: 4 tokens asked for, {len(r.token_ids)} generated ({r.finish_reason})"}
            return {"ok": True, "reason": "", "latency_ms": (time.perf_counter() - t0) * 1e3}
    with load_model(pkg, measure_backends=False) as model:
        if g is None:
            feeds = {t.name: np.zeros(t.min_shape(), dtype=t.dtype) for t in model.manifest.inputs_for(model.variant)}
            model.predict(feeds)
            return {"ok": True, "reason": "", "latency_ms": None}
        with np.load(pkg.path_of(g.inputs), allow_pickle=False) as f:
            feeds = {k: f[k] for k in f.files}
        with np.load(pkg.path_of(g.outputs), allow_pickle=False) as f:
            want = {k: f[k] for k in f.files}
        res = model.predict(feeds)
        for name, exp in want.items():
            if name not in res.outputs:
                return {"ok": False, "reason": f"golden: output {name!r} missing from the model's outputs {sorted(res.outputs)}"}
            got = np.asarray(res.outputs[name])
            if got.shape != exp.shape or not np.allclose(got, exp, rtol=g.rtol, atol=g.atol):
                err = float(np.max(np.abs(got.astype(np.float64) - exp))) if got.shape == exp.shape else float("nan")
                return {"ok": False, "reason": f"golden: output {name!r} differs (max abs error {err:.6g}, atol {g.atol}, rtol {g.rtol})"}
        best = float("inf")
        for _ in range(TIMED_CALLS):
            t0 = time.perf_counter()
            model.predict(feeds)
            best = min(best, (time.perf_counter() - t0) * 1e3)
        if g.max_latency_ms is not None and best > g.max_latency_ms:
            return {"ok": False, "reason": f"latency: best of {TIMED_CALLS} calls {best:.4g} ms > max_latency_ms {g.max_latency_ms}",
                    "latency_ms": best}  # fmt: skip
        return {"ok": True, "reason": "", "latency_ms": best}


def _verdict(package_dir: str) -> dict[str, Any]:
    try:
        return check_package(package_dir)
    except Exception as e:  # anything the model or runtime raises is a failed check
        return {"ok": False, "reason": f"load/run failed: {type(e).__name__}: {e}"}


def _die_with_parent() -> None:
    """Linux: SIGKILL this child if the updater dies (no orphaned health checks)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def run_health_check(package_dir: Path, timeout_s: float, *, start_method: str = "spawn") -> HealthResult:
    """Run :func:`check_package` in a child bounded by ``timeout_s``."""
    t0 = time.monotonic()
    if start_method == "fork":
        out = _run_forked(str(package_dir), timeout_s)
    elif start_method == "spawn":
        out = _run_spawned(str(package_dir), timeout_s)
    else:
        raise OptionsError(f"start_method: expected 'spawn' or 'fork', got {start_method!r}")
    wall = time.monotonic() - t0
    return HealthResult(bool(out.get("ok")), str(out.get("reason", "")), out.get("latency_ms"), wall)


def _run_spawned(package_dir: str, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "edge_sdk.store.health", package_dir]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    env.pop("EDGE_SDK_STORE_CRASH_AT", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=_die_with_parent)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"ok": False, "reason": f"health check timed out after {timeout_s:g} s"}
    return _parse(stdout, proc.returncode, stderr.decode(errors="replace")[-500:])


def _parse(stdout: bytes, rc: int, stderr: str = "") -> dict[str, Any]:
    lines = stdout.decode(errors="replace").strip().splitlines()
    if rc != 0 or not lines:
        how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        return {"ok": False, "reason": f"health check process crashed ({how}){': ' + stderr.strip() if stderr.strip() else ''}"}
    try:
        return dict(json.loads(lines[-1]))
    except ValueError:
        return {"ok": False, "reason": f"health check printed no verdict: {lines[-1][:200]!r}"}


def _run_forked(package_dir: str, timeout_s: float) -> dict[str, Any]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        rc = 0
        try:
            os.close(r)
            _die_with_parent()
            os.environ.pop("EDGE_SDK_STORE_CRASH_AT", None)
            os.write(w, (json.dumps(_verdict(package_dir)) + "\n").encode())
        except BaseException:
            rc = 70
        finally:
            os._exit(rc)
    os.close(w)
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"ok": False, "reason": f"health check timed out after {timeout_s:g} s"}
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                buf += chunk
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    return _parse(buf, -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


if __name__ == "__main__":  # pragma: no cover - exercised through run_health_check
    print(json.dumps(_verdict(sys.argv[1])))
