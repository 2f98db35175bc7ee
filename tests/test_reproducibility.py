"""Deterministic mode (``LoadOptions(deterministic=True)``): what it sets, and what it guarantees,
shown with real ONNX Runtime and LiteRT sessions on the demo package (fp32 and int8 ONNX, fp32
TFLite), a MobileNetV2-class ONNX model (tools/fixtures/mobilenetv2.py) and a wider MLP.

Guaranteed and asserted (deterministic mode, one device, one runtime version):
  - the same input gives bit-identical outputs on repeated runs and after a fresh load (for ONNX
    Runtime the fresh load goes through the optimised-model cache);
  - row i of a batch-8 call equals the batch-1 call of row i, bit for bit.
Measured and asserted, to show why the mode pins what it pins:
  - the graph optimisation level changes the bits (so it is fixed, never per-call);
  - LiteRT's builtin kernels without XNNPACK are *not* batch-invariant (so the mode keeps XNNPACK);
  - ONNX Runtime's CPU kernels give the same bits for 1, 2 and 4 threads on these models (true
    here; docs/reproducibility.md says why the mode still fixes the count).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_manifest, mlp_onnx

import edge_sdk
from edge_sdk import cli
from edge_sdk.backends import ort as ort_backend
from edge_sdk.backends.base import SessionOptions
from edge_sdk.profiles import load_profile

PROFILE = "generic-x86_64"
BATCH = 8


@pytest.fixture(scope="module")
def mbv2_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MobileNetV2 (width 0.5, 96x96, 100 classes; random weights), dynamic batch 1..8."""
    from converters.packaging import write_package
    from tools.fixtures.mobilenetv2 import build_mobilenetv2

    root = tmp_path_factory.mktemp("mbv2") / "mbv2"
    data = build_mobilenetv2(0.5, 96, 100, seed=0, batch="N").SerializeToString()
    manifest = {
        "schema": 1, "name": "mbv2", "version": "0.1", "task": "raw",
        "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 96, 96], "dims": {"batch": [1, BATCH]}}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 100]}],
        "variants": [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"}],
    }  # fmt: skip
    write_package(root, manifest, {"m.onnx": data})
    return root


@pytest.fixture(scope="module")
def wide_mlp_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x[batch, 512] -> MatMul(512x256) -> Add -> Relu, dynamic batch 1..8."""
    from converters.packaging import write_package

    root = tmp_path_factory.mktemp("wmlp") / "wmlp"
    write_package(root, mlp_manifest(512, 256), {"m.onnx": mlp_onnx(512, 256, seed=3)})
    return root


def _input(model: edge_sdk.Model, seed: int) -> np.ndarray:
    spec = model.inputs[0]
    shape = (BATCH,) + tuple(int(d) for d in spec.shape[1:])
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _outs(r: edge_sdk.Result) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in r.outputs.items()}


def _bit_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a
    )


CASES = [
    pytest.param("demo", "fp32-onnx", id="demo-fp32-onnx"),
    pytest.param("demo", "int8-onnx", id="demo-int8-onnx"),
    pytest.param("demo", "fp32-tflite", id="demo-fp32-tflite"),
    pytest.param("mbv2", "fp32", id="mobilenetv2-fp32-onnx"),
    pytest.param("mlp", "fp32", id="mlp512-fp32-onnx"),
]


@pytest.fixture
def packages(demo_package: Path, mbv2_package: Path, wide_mlp_package: Path) -> dict[str, Path]:
    return {"demo": demo_package, "mbv2": mbv2_package, "mlp": wide_mlp_package}


@pytest.mark.parametrize("pkg, variant", CASES)
def test_deterministic_mode_is_bit_identical_across_runs_loads_and_batch_sizes(packages, tmp_path, pkg, variant) -> None:
    cache = tmp_path / "cache"
    kw = dict(variant=variant, deterministic=True, cache_dir=cache)
    with edge_sdk.load(packages[pkg], PROFILE, **kw) as m:
        assert m.session.info.threads == 1 and m.describe()["deterministic"] is True
        x = _input(m, seed=7)
        first = _outs(m.predict(x))
        # 1. repeated runs, same session
        for _ in range(4):
            assert _bit_equal(first, _outs(m.predict(x)))
        # 2. batch invariance: row i of the batch-8 call == the batch-1 call of row i
        rows = [_outs(m.predict(np.ascontiguousarray(x[i : i + 1]))) for i in range(BATCH)]
        for i, r in enumerate(rows):
            assert _bit_equal({k: v[i : i + 1] for k, v in first.items()}, r), f"row {i}"
        # predict_batch stacks single rows into one call: the same bits again
        batched = m.predict_batch([np.ascontiguousarray(x[i : i + 1]) for i in range(BATCH)])
        assert batched[0].batch_size == BATCH
        for i, r in enumerate(batched):
            assert _bit_equal(rows[i], _outs(r)), f"predict_batch row {i}"
    # 3. a fresh load (ONNX Runtime: now from the optimised-model cache the first load wrote)
    with edge_sdk.load(packages[pkg], PROFILE, **kw) as m2:
        if m2.session.info.backend == "onnxruntime":
            assert m2.session.info.optimized_cache.startswith("hit"), m2.session.info.optimized_cache
        assert _bit_equal(first, _outs(m2.predict(x)))


def test_deterministic_mode_sets_the_runtime_options(demo_package: Path) -> None:
    with edge_sdk.load(demo_package, PROFILE, variant="fp32-onnx", deterministic=True) as m:
        assert m.session._sess.get_session_options().use_deterministic_compute is True  # the real ORT session's option
        d = m.describe()
        assert d["threads"] == 1 and d["deterministic"] is True
        assert "use_deterministic_compute=True" in d["determinism"] and "intra_op_num_threads=1" in d["determinism"]
    with edge_sdk.load(demo_package, PROFILE, variant="fp32-onnx") as m:
        assert m.session._sess.get_session_options().use_deterministic_compute is False
        assert m.describe()["deterministic"] is False and m.describe()["determinism"] == []
    # an explicit thread count is kept (fixed by the caller), not replaced by 1
    with edge_sdk.load(demo_package, PROFILE, variant="fp32-onnx", deterministic=True, threads=2) as m:
        assert m.session.info.threads == 2 and "intra_op_num_threads=2" in m.session.info.determinism
    with edge_sdk.load(demo_package, PROFILE, variant="fp32-tflite", deterministic=True) as m:
        assert m.session.info.threads == 1
        assert m.session.info.determinism[0] == "num_threads=1"


def test_cuda_provider_options_in_deterministic_mode(tmp_path: Path) -> None:
    """No GPU here: the provider options the backend builds for the CUDA and TensorRT EPs."""
    det, plain = SessionOptions(deterministic=True), SessionOptions()
    assert ort_backend._provider_options("CUDAExecutionProvider", det) == {"cudnn_conv_algo_search": "DEFAULT"}
    assert ort_backend._provider_options("CUDAExecutionProvider", plain) == {}  # the EP's own default (EXHAUSTIVE)
    assert ort_backend._provider_options("CPUExecutionProvider", det) == {}
    trt = ort_backend._provider_options("TensorrtExecutionProvider", SessionOptions(deterministic=True, cache_dir=tmp_path))
    assert trt["trt_engine_cache_enable"] == "True"  # the engine cache is what makes TensorRT repeat across loads
    s = ort_backend.determinism_settings(det, ("CUDAExecutionProvider", "CPUExecutionProvider"), "all")
    assert "CUDAExecutionProvider cudnn_conv_algo_search=DEFAULT" in s and "use_deterministic_compute=True" in s
    assert ort_backend.determinism_settings(plain, ("CUDAExecutionProvider",), "all") == ()


def test_deterministic_mode_does_not_pick_a_backend_by_timing(demo_package: Path, tmp_path: Path) -> None:
    """fp32 only: the ONNX and TFLite variants tie; without the mode ``load`` times both and keeps
    the faster (a choice that can flip between loads); with it, the profile's order decides."""
    base = load_profile(PROFILE)
    prof = dataclasses.replace(base, runtime=dataclasses.replace(base.runtime, precisions=("fp32",)))
    chosen = set()
    for i in range(2):
        cache = tmp_path / f"c{i}"
        with edge_sdk.load(demo_package, prof, deterministic=True, cache_dir=cache) as m:
            assert m.selection.tied and not m.selection.measured
            chosen.add(m.variant.id)
        assert not (cache / "selection.json").exists()
    assert chosen == {"fp32-onnx"}  # generic-x86_64 lists onnxruntime before litert
    with edge_sdk.load(demo_package, prof, cache_dir=tmp_path / "c3", measure_runs=3, measure_budget_s=0.2) as m:
        assert m.selection.measured  # the ordinary path does measure


def test_graph_optimisation_level_changes_the_bits(demo_package: Path, mbv2_package: Path) -> None:
    """Why the level is part of the fixed settings: 'all' and 'disable' agree closely, not exactly."""
    for pkg, variant in ((demo_package, "fp32-onnx"), (mbv2_package, "fp32")):
        outs = {}
        for level in ("all", "disable"):
            with edge_sdk.load(pkg, PROFILE, variant=variant, deterministic=True, graph_optimization=level) as m:
                x = _input(m, seed=3)
                outs[level] = next(iter(_outs(m.predict(x)).values()))
        assert not np.array_equal(outs["all"], outs["disable"]), variant
        np.testing.assert_allclose(outs["all"], outs["disable"], rtol=1e-4, atol=1e-4)


def test_onnxruntime_cpu_bits_do_not_depend_on_the_thread_count(mbv2_package: Path, demo_package: Path) -> None:
    for pkg, variant in ((mbv2_package, "fp32"), (demo_package, "fp32-onnx"), (demo_package, "int8-onnx")):
        ref = None
        for threads in (1, 2, 4):
            with edge_sdk.load(pkg, PROFILE, variant=variant, threads=threads) as m:
                o = _outs(m.predict(_input(m, seed=5)))
            ref = ref or o
            assert _bit_equal(ref, o), (variant, threads)


def test_litert_without_xnnpack_is_not_batch_invariant(demo_package: Path) -> None:
    """The reason deterministic mode keeps LiteRT's default resolver (XNNPACK): the builtin
    optimised kernels alone give row i of a batch a few ulp away from the same row run alone."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    data = (demo_package / "model_fp32.tflite").read_bytes()
    x = np.random.default_rng(1).standard_normal((BATCH, 32, 32, 3)).astype(np.float32)

    def run(resolver: OpResolverType, batch: np.ndarray) -> np.ndarray:
        it = Interpreter(model_content=data, num_threads=1, experimental_op_resolver_type=resolver)
        d, o = it.get_input_details()[0], it.get_output_details()[0]
        it.resize_tensor_input(d["index"], list(batch.shape), strict=True)
        it.allocate_tensors()
        it.set_tensor(d["index"], batch)
        it.invoke()
        return it.get_tensor(o["index"]).copy()

    def max_row_diff(resolver: OpResolverType) -> float:
        full = run(resolver, x)
        return max(float(np.abs(full[i : i + 1] - run(resolver, x[i : i + 1])).max()) for i in range(BATCH))

    assert max_row_diff(OpResolverType.AUTO) == 0.0  # XNNPACK: what the SDK uses
    d = max_row_diff(OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    assert 0.0 < d < 1e-3, d


def test_cli_deterministic_flag(demo_package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    img = Path(edge_sdk.__file__).parent / "assets" / "samples" / "circle_1.png"
    rc = cli.main(["predict", str(demo_package), str(img), "--profile", PROFILE, "--deterministic", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert "use_deterministic_compute=True" in data["determinism"] or "num_threads=1" in data["determinism"]
    args = cli.build_parser().parse_args(["serve", str(demo_package), "--deterministic"])
    assert cli.load_kwargs(args)["deterministic"] is True
    with pytest.raises(SystemExit):  # serve's workers run the session directly: no result cache there
        cli.build_parser().parse_args(["serve", str(demo_package), "--result-cache", "4"])


def test_deterministic_option_is_validated() -> None:
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="deterministic: expected True or False"):
            edge_sdk.LoadOptions(deterministic=bad)
    assert edge_sdk.LoadOptions(deterministic=True).session_options(load_profile(PROFILE), Path("/tmp"), cpu_count=16).threads == 1
    # without the mode the count follows the machine (the profile's 4, capped by the CPUs)
    assert edge_sdk.LoadOptions().session_options(load_profile(PROFILE), Path("/tmp"), cpu_count=16).threads == 4
    assert edge_sdk.LoadOptions().session_options(load_profile(PROFILE), Path("/tmp"), cpu_count=2).threads == 2
