"""converters.calibration: real images, videos, numpy files and CSVs made in tmp_path."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import pytest

from converters.calibration import CalibrationError, DataSet, load_data
from edge_sdk.package import ImagePreprocess, TensorSpec
from edge_sdk.processing.image import load_image, preprocess_image

PRE = ImagePreprocess((16, 16), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
IMG = TensorSpec("image", "float32", ("batch", 3, 16, 16), "NCHW", (("batch", 1, 8),), PRE)
IMG_U8_NHWC = TensorSpec("image", "uint8", (1, 16, 16, 3), "NHWC", (), ImagePreprocess((16, 16)))
IMG_NO_PRE = TensorSpec("image", "float32", ("batch", 3, 16, 16), "NCHW", (("batch", 1, 8),))
VEC = TensorSpec("x", "float32", ("batch", 4), "NC", (("batch", 1, 8),))
A = TensorSpec("a", "float32", ("batch", 4), "NC", (("batch", 1, 8),))
B = TensorSpec("b", "int64", (1, 2), "NC")
NLC = TensorSpec("imu", "float32", ("batch", 8, 3), "NLC", (("batch", 1, 4),))
NCL = TensorSpec("imu", "float32", (1, 3, 8), "NCL")
NO_LAYOUT = TensorSpec("imu", "float32", (1, 8, 3))
SEQ = TensorSpec("x", "float32", (1, "n"), "NC", (("n", 2, 6),))
DYN_T = TensorSpec("imu", "float32", (1, "t", 3), "NLC", (("t", 4, 10),))


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def write_img(path: Path, bgr: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), bgr), path
    return path


def random_bgr(seed: int, h: int = 24, w: int = 20) -> np.ndarray:
    return rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------
# image folders


def test_image_folder_matches_preprocess_image(tmp_path: Path) -> None:
    folder = tmp_path / "img"
    files = [
        write_img(folder / "b.png", random_bgr(1)),
        write_img(folder / "a.jpg", random_bgr(2, 40, 30)),
        write_img(folder / "sub" / "c.bmp", random_bgr(3, 16, 16)),
        write_img(folder / "red.png", np.dstack([np.zeros((16, 16), np.uint8)] * 2 + [np.full((16, 16), 255, np.uint8)])),
    ]
    (folder / "notes.txt").write_text("not an image")  # skipped
    write_img(folder / ".hidden" / "x.png", random_bgr(4))  # hidden: skipped
    ds = load_data(folder, [IMG], progress=False)
    assert ds.sources == ("img/a.jpg", "img/b.png", "img/red.png", "img/sub/c.bmp")
    assert ds.inputs == ("image",) and len(ds) == 4
    assert ds.labels is None and ds.class_names is None
    by_name = {f"img/{p.relative_to(folder).as_posix()}": p for p in files}
    for src, sample in zip(ds.sources, ds.samples):
        x = sample["image"]
        assert x.dtype == np.float32 and x.shape == (1, 3, 16, 16) and x.flags.c_contiguous
        want, _ = preprocess_image(load_image(by_name[src]), IMG)
        np.testing.assert_array_equal(x, want)
    # an independent check of colour order, scale, mean/std and layout: pure red, already 16x16
    red = ds.samples[ds.sources.index("img/red.png")]["image"][0]
    np.testing.assert_allclose(red[0], (1.0 - 0.5) / 0.25)  # R channel first
    np.testing.assert_allclose(red[1:], (0.0 - 0.5) / 0.25)


def test_image_folder_uint8_nhwc(tmp_path: Path) -> None:
    bgr = random_bgr(5, 16, 16)
    write_img(tmp_path / "img" / "x.png", bgr)
    (x,) = [s["image"] for s in load_data(tmp_path / "img", [IMG_U8_NHWC], progress=False).samples]
    assert x.dtype == np.uint8 and x.shape == (1, 16, 16, 3)
    np.testing.assert_array_equal(x[0], bgr[:, :, ::-1])  # same size: pixels as they are, RGB


def test_class_subfolders_give_labels(tmp_path: Path) -> None:
    folder = tmp_path / "classes"
    write_img(folder / "dog" / "d1.png", random_bgr(1))
    write_img(folder / "cat" / "c1.jpg", random_bgr(2))
    write_img(folder / "cat" / "c2.png", random_bgr(3))
    write_img(folder / "dog" / "deep" / "d2.png", random_bgr(4))
    ds = load_data(folder, [IMG], progress=False)
    assert ds.class_names == ("cat", "dog")
    assert list(zip(ds.sources, ds.labels or ())) == [
        ("classes/cat/c1.jpg", 0),
        ("classes/cat/c2.png", 0),
        ("classes/dog/d1.png", 1),
        ("classes/dog/deep/d2.png", 1),
    ]
    # one image outside a class folder: no labels
    write_img(folder / "loose.png", random_bgr(5))
    ds = load_data(folder, [IMG], progress=False)
    assert ds.labels is None and ds.class_names is None


def test_labels_csv_in_image_folder(tmp_path: Path) -> None:
    folder = tmp_path / "img"
    for i in range(3):
        write_img(folder / f"{i}.png", random_bgr(i))
    (folder / "labels.csv").write_text("file,label\n0.png,2\n1.png,0\n2.png,2\n")
    ds = load_data(folder, [IMG], progress=False)
    assert ds.labels == (2, 0, 2) and ds.class_names is None
    (folder / "labels.csv").write_text("2.png,zebra\n0.png,ant\n1.png,zebra\n")
    ds = load_data(folder, [IMG], progress=False)
    assert ds.class_names == ("ant", "zebra") and ds.labels == (0, 1, 1)
    (folder / "labels.csv").write_text("0.png,1\n1.png,1\n")
    with pytest.raises(CalibrationError, match=r"labels\.csv.*no label.*2\.png"):
        load_data(folder, [IMG], progress=False)


def test_limit_is_evenly_spaced_and_deterministic(tmp_path: Path) -> None:
    folder = tmp_path / "img"
    for i in range(10):
        write_img(folder / f"{i:02d}.png", random_bgr(i, 8, 8))
    ds = load_data(folder, [IMG], limit=3, progress=False)
    assert ds.sources == ("img/00.png", "img/03.png", "img/06.png")
    shifted = load_data(folder, [IMG], limit=3, seed=7, progress=False)
    assert shifted.sources == load_data(folder, [IMG], limit=3, seed=7, progress=False).sources
    idx = [int(s[4:6]) for s in shifted.sources]
    assert len(set(idx)) == 3 and idx == sorted(idx) and all(3 <= b - a <= 4 for a, b in zip(idx, idx[1:]))
    assert len(load_data(folder, [IMG], limit=50, progress=False)) == 10


# --------------------------------------------------------------------------
# video


def _coded_frame(i: int) -> np.ndarray:
    """64x64 BGR frame: bit b of i is a white 16x16 block at grid cell b (row-major 4x4)."""
    f = np.zeros((64, 64, 3), np.uint8)
    for b in range(6):
        if i >> b & 1:
            r, c = divmod(b, 4)
            f[r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16] = 255
    return f


def _decode_index(x: np.ndarray) -> int:
    """Frame index back from a preprocessed [1, 3, 16, 16] sample (blocks are 4x4 there)."""
    px = x[0, 0] * 0.25 + 0.5  # undo mean/std: 0..1
    return sum(1 << b for b in range(6) if px[(b // 4) * 4 + 2, (b % 4) * 4 + 2] > 0.5)


def _write_video(path: Path, fourcc: str, n: int) -> Path:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 10, (64, 64))
    assert w.isOpened()
    for i in range(n):
        w.write(_coded_frame(i))
    w.release()
    cap = cv2.VideoCapture(str(path))
    ok, _ = cap.read()
    cap.release()
    assert ok, f"{path} does not decode"
    return path


@pytest.mark.parametrize("name, fourcc", [("clip.avi", "MJPG"), ("clip.mp4", "mp4v")])
def test_video_every_nth_frame(tmp_path: Path, name: str, fourcc: str) -> None:
    path = _write_video(tmp_path / name, fourcc, 25)
    ds = load_data(path, [IMG], video_every=10, progress=False)
    assert ds.sources == (f"{name}#frame=0", f"{name}#frame=10", f"{name}#frame=20")
    assert [_decode_index(s["image"]) for s in ds.samples] == [0, 10, 20]
    # independently: decode every frame here and preprocess the same ones (BGR in)
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    cap.release()
    assert len(frames) == 25
    for i, s in zip((0, 10, 20), ds.samples):
        want, _ = preprocess_image(frames[i], IMG, color="BGR")
        np.testing.assert_array_equal(s["image"], want)
    # limit over candidates 0, 5, 10, 15, 20 -> evenly spaced 0, 10
    ds = load_data(path, [IMG], video_every=5, limit=2, progress=False)
    assert [_decode_index(s["image"]) for s in ds.samples] == [0, 10]
    assert ds.sources == (f"{name}#frame=0", f"{name}#frame=10")


# --------------------------------------------------------------------------
# numpy files


def test_npy_layouts(tmp_path: Path) -> None:
    data = rng(1).standard_normal((6, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)  # [N, 4]: axis 0 split into batch-1 samples
    np.save(tmp_path / "x5.npy", data[:, None])  # [N, 1, 4]
    np.save(tmp_path / "one.npy", data[:1])  # [1, 4]: one sample
    for name in ("x.npy", "x5.npy"):
        ds = load_data(tmp_path / name, [VEC], progress=False)
        assert ds.sources == tuple(f"{name}[{i}]" for i in range(6))
        for i, s in enumerate(ds.samples):
            assert s["x"].shape == (1, 4) and s["x"].dtype == np.float32 and type(s["x"]) is np.ndarray
            assert s["x"].flags.owndata and s["x"].flags.writeable  # a copy, not a view of the memory map
            np.testing.assert_array_equal(s["x"][0], data[i])
    ds = load_data(tmp_path / "one.npy", [VEC], progress=False)
    assert len(ds) == 1 and ds.sources == ("one.npy[0]",)
    ds = load_data(tmp_path / "x.npy", [VEC], limit=2, progress=False)
    assert ds.sources == ("x.npy[0]", "x.npy[3]")


def test_npz_multi_input_with_labels(tmp_path: Path) -> None:
    a = rng(2).standard_normal((5, 4)).astype(np.float32)
    b = np.arange(10, dtype=np.int64).reshape(5, 1, 2)
    labels = np.array([3, 1, 4, 1, 5])
    np.savez(tmp_path / "d.npz", a=a, b=b, labels=labels)
    ds = load_data(tmp_path / "d.npz", [A, B], progress=False)
    assert ds.inputs == ("a", "b") and len(ds) == 5 and ds.labels == (3, 1, 4, 1, 5)
    for i, s in enumerate(ds.samples):
        assert set(s) == {"a", "b"} and s["a"].shape == (1, 4) and s["b"].dtype == np.int64
        np.testing.assert_array_equal(s["a"][0], a[i])
        np.testing.assert_array_equal(s["b"], b[i])
    ds = load_data(tmp_path / "d.npz", [A, B], limit=2, progress=False)
    assert ds.labels == (3, 4) and ds.sources == ("d.npz[0]", "d.npz[2]")


# --------------------------------------------------------------------------
# CSV


def test_csv_nlc_with_header(tmp_path: Path) -> None:
    vals = np.round(rng(3).standard_normal((20, 3)), 4)
    path = tmp_path / "log.csv"
    path.write_text("ax,ay,az\n" + "".join(",".join(str(v) for v in row) + "\n" for row in vals))
    ds = load_data(path, [NLC], progress=False)  # T=8, hop 4: starts 0, 4, 8, 12
    assert ds.sources == ("log.csv[rows 0:8]", "log.csv[rows 4:12]", "log.csv[rows 8:16]", "log.csv[rows 12:20]")
    independent = np.loadtxt(path, delimiter=",", skiprows=1)
    for s0, s in zip((0, 4, 8, 12), ds.samples):
        x = s["imu"]
        assert x.shape == (1, 8, 3) and x.dtype == np.float32
        np.testing.assert_array_equal(x[0], independent[s0 : s0 + 8].astype(np.float32))
    assert len(load_data(path, [NO_LAYOUT], csv_hop=3, progress=False)) == 5  # no layout: NLC; starts 0,3,6,9,12


def test_csv_ncl_without_header_and_dynamic_t(tmp_path: Path) -> None:
    vals = np.arange(60, dtype=np.float64).reshape(20, 3) / 8
    path = tmp_path / "raw.csv"
    np.savetxt(path, vals, delimiter=",")
    ds = load_data(path, [NCL], csv_hop=5, progress=False)  # starts 0, 5, 10
    assert ds.sources == ("raw.csv[rows 0:8]", "raw.csv[rows 5:13]", "raw.csv[rows 10:18]")
    for s0, s in zip((0, 5, 10), ds.samples):
        assert s["imu"].shape == (1, 3, 8) and s["imu"].flags.c_contiguous
        np.testing.assert_array_equal(s["imu"][0], vals[s0 : s0 + 8].T.astype(np.float32))
    ds = load_data(path, [DYN_T], progress=False)  # T: upper bound 10, hop 5
    assert ds.sources == ("raw.csv[rows 0:10]", "raw.csv[rows 5:15]", "raw.csv[rows 10:20]")
    assert ds.samples[0]["imu"].shape == (1, 10, 3)


# --------------------------------------------------------------------------
# the data set: reader, split, quantize_static


def _tiny_conv_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = rng(9).standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.2
    b = np.zeros(4, np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 16, 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_reader_is_fresh_and_quantize_static_runs(tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    for i in range(6):
        write_img(tmp_path / "img" / f"{i}.png", random_bgr(i))
    ds = load_data(tmp_path / "img", [IMG], progress=False)
    for _ in range(2):  # each call starts over
        r = ds.reader()
        assert isinstance(r, CalibrationDataReader)
        got = list(iter(r.get_next, None))
        assert len(got) == len(ds) and r.get_next() is None
        for g, s in zip(got, ds.samples):
            assert g.keys() == s.keys() and g["image"] is s["image"]
    src = _tiny_conv_onnx(tmp_path / "tiny.onnx")
    dst = tmp_path / "tiny_int8.onnx"
    quantize_static(str(src), str(dst), ds.reader(), quant_format=QuantFormat.QDQ)
    ops = {n.op_type for n in onnx.load(str(dst)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    assert sess.run(None, ds.samples[0])[0].shape == (1, 4, 16, 16)


def test_split_deterministic_disjoint_labels_aligned(tmp_path: Path) -> None:
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.savez(tmp_path / "d.npz", x=x, labels=np.arange(10) % 3)
    ds = load_data(tmp_path / "d.npz", [VEC], progress=False)
    kept, held = ds.split(0.3, seed=1)
    kept2, held2 = ds.split(0.3, seed=1)
    assert kept.sources == kept2.sources and held.sources == held2.sources
    assert len(held) == 3 and len(kept) == 7
    assert not set(kept.sources) & set(held.sources)
    assert sorted(kept.sources + held.sources, key=lambda s: int(s[6:-1])) == list(ds.sources)
    for part in (kept, held):
        for src, s, lab in zip(part.sources, part.samples, part.labels or ()):
            i = int(src[6:-1])
            assert s["x"][0, 0] == 4 * i and lab == i % 3
    assert ds.split(0.3, seed=2)[1].sources != held.sources or ds.split(0.3, seed=3)[1].sources != held.sources
    with pytest.raises(CalibrationError, match="holdout"):
        ds.split(1.0)


def test_progress_bar_does_not_break_loading(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 4), np.float32))
    assert len(load_data(tmp_path / "x.npy", [VEC], progress=True)) == 3


def test_dataset_is_frozen() -> None:
    ds = DataSet(inputs=("x",), samples=({"x": np.zeros((1, 4), np.float32)},), sources=("s",))
    with pytest.raises(AttributeError):
        ds.labels = (1,)  # type: ignore[misc]
    with pytest.raises(ValueError):
        DataSet(inputs=("x",), samples=(), sources=("s",))


# --------------------------------------------------------------------------
# bad inputs: each names the file


def _folder(tmp: Path, name: str, files: dict[str, bytes]) -> Path:
    d = tmp / name
    d.mkdir()
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def _npy(tmp: Path, name: str, arr: np.ndarray) -> Path:
    np.save(tmp / name, arr)
    return tmp / name


def _text(tmp: Path, name: str, text: str) -> Path:
    (tmp / name).write_text(text)
    return tmp / name


def _nan_at_3(tmp: Path) -> Path:
    a = np.zeros((6, 4), np.float32)
    a[3, 2] = np.nan
    return _npy(tmp, "has_nan.npy", a)


def _good_image_folder(tmp: Path) -> Path:
    write_img(tmp / "plain_imgs" / "ok.png", random_bgr(0))
    return tmp / "plain_imgs"


def _csv_rows(rows: int, cols: int = 3) -> str:
    return "".join(",".join(str(r + c / 10) for c in range(cols)) + "\n" for r in range(rows))


def _pickled(tmp: Path) -> Path:
    (tmp / "data.pkl").write_bytes(pickle.dumps(np.zeros(3)))
    return tmp / "data.pkl"


def _pickled_npy(tmp: Path) -> Path:
    np.save(tmp / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return tmp / "objects.npy"


BAD: list[tuple[str, Callable[[Path], Path], list[TensorSpec], str | tuple[str, ...]]] = [
    # a folder with no images at all
    ("empty", lambda t: _folder(t, "empty_dir", {}), [IMG], "no images"),
    # random bytes named .png: OpenCV cannot decode it
    ("unreadable-image", lambda t: _folder(t, "imgs", {"broken.png": rng().bytes(200)}), [IMG], "broken.png"),
    # images for an input that declares no preprocessing
    ("image-no-preprocess", _good_image_folder, [IMG_NO_PRE], "no preprocessing declared"),
    # [5, 3] for an input [batch, 4]
    ("npy-wrong-shape", lambda t: _npy(t, "wrong_shape.npy", np.zeros((5, 3), np.float32)), [VEC], ("expected dim 1 = 4", "shape (5, 3)")),
    # rank 4 for a rank-2 input
    ("npy-wrong-rank", lambda t: _npy(t, "rank4.npy", np.zeros((2, 2, 2, 4), np.float32)), [VEC], "expected rank 2"),
    # float64 where float32 is declared: never cast
    ("npy-float64", lambda t: _npy(t, "f64.npy", np.zeros((3, 4))), [VEC], "expects dtype float32, the file holds float64"),
    # NaN in sample 3
    ("npy-nan", _nan_at_3, [VEC], "has_nan.npy[3]"),
    # an .npy of pickled objects
    ("npy-pickled", _pickled_npy, [VEC], "pickled"),
    # [N, *sample] with samples of batch 9: samples have batch 1
    ("npy-batch-not-1", lambda t: _npy(t, "big_batch.npy", np.zeros((2, 9, 4), np.float32)), [VEC], "expected batch 1"),
    # a dynamic dim of 8 above its bound 6
    ("npy-dim-bound", lambda t: _npy(t, "long.npy", np.zeros((3, 8), np.float32)), [SEQ], "must be in [2, 6]"),
    # npz without the second input
    ("npz-missing-input", lambda t: (np.savez(t / "only_a.npz", a=np.zeros((2, 4), np.float32)), t / "only_a.npz")[1], [A, B], "'b'"),
    # npz labels of the wrong length
    (
        "npz-bad-labels",
        lambda t: (np.savez(t / "lab.npz", x=np.zeros((3, 4), np.float32), labels=np.arange(2)), t / "lab.npz")[1],
        [VEC],
        "expected 3 integer class indices",
    ),
    # a text cell in a data row (line 3 after the header)
    ("csv-text", lambda t: _text(t, "text.csv", "a,b,c\n" + _csv_rows(1) + "1,abc,2\n" + _csv_rows(10)), [NLC], "line 3"),
    # an empty cell
    ("csv-empty-cell", lambda t: _text(t, "hole.csv", _csv_rows(4) + "1,,2\n" + _csv_rows(10)), [NLC], "line 5"),
    # a NaN cell
    ("csv-nan", lambda t: _text(t, "nan.csv", _csv_rows(4) + "1,nan,2\n" + _csv_rows(10)), [NLC], "finite"),
    # 5 rows for windows of 8
    ("csv-too-short", lambda t: _text(t, "short.csv", _csv_rows(5)), [NLC], "5 data row(s)"),
    # 4 channels for an input of 3
    ("csv-channels", lambda t: _text(t, "wide.csv", _csv_rows(12, 4)), [NLC], "4 channel column(s)"),
    # a rank-2 input cannot take CSV windows
    ("csv-rank", lambda t: _text(t, "rank.csv", _csv_rows(12)), [VEC], "rank-3"),
    # pickles are never loaded
    ("pickle", _pickled, [VEC], "pickle"),
    # an unknown suffix
    ("unknown-suffix", lambda t: _text(t, "data.parquet", "x"), [VEC], "unknown kind"),
    # nothing at that path
    ("missing", lambda t: t / "nowhere.npy", [VEC], "no such file"),
    # random bytes named .mp4
    ("not-a-video", lambda t: (t / "fake.mp4").write_bytes(rng().bytes(500)) and t / "fake.mp4", [IMG], "cannot open"),
]


@pytest.mark.parametrize("make, specs, fragment", [pytest.param(m, s, f, id=i) for i, m, s, f in BAD])
def test_bad_inputs_name_the_file(
    tmp_path: Path, make: Callable[[Path], Path], specs: list[TensorSpec], fragment: str | tuple[str, ...]
) -> None:
    path = make(tmp_path)
    with pytest.raises(CalibrationError) as ei:
        load_data(path, specs, progress=False)
    msg = str(ei.value)
    assert path.name in msg, msg
    for frag in (fragment,) if isinstance(fragment, str) else fragment:
        assert frag in msg, msg


def test_npz_with_one_array_per_sample_of_varying_shape(tmp_path: Path) -> None:
    """Per-sample .npz (np.savez(f, *samples), or <input>/<i> keys): shapes may differ between samples;
    a sample without its batch axis gets one; a sample of another rank is an error naming its key."""
    from converters.calibration import CalibrationError, load_data
    from edge_sdk.package import TensorSpec

    spec = TensorSpec("x", "float32", ("b", 3, "w"), dim_bounds=(("b", 1, 1), ("w", 1, 64)))
    arrs = [np.ones((1, 3, w), np.float32) * w for w in (8, 16, 4)] + [np.ones((3, 10), np.float32)]
    np.savez(tmp_path / "pos.npz", *arrs, labels=np.array([0, 1, 0, 1]))
    ds = load_data(tmp_path / "pos.npz", [spec], progress=False)
    assert [s["x"].shape for s in ds.samples] == [(1, 3, 8), (1, 3, 16), (1, 3, 4), (1, 3, 10)] and ds.labels == (0, 1, 0, 1)
    np.savez(tmp_path / "named.npz", **{f"x/{i}": a for i, a in enumerate(arrs[:2])})
    assert len(load_data(tmp_path / "named.npz", [spec], progress=False)) == 2
    np.savez(tmp_path / "bad.npz", np.ones((1, 1, 3, 8), np.float32))
    with pytest.raises(CalibrationError, match="arr_0"):
        load_data(tmp_path / "bad.npz", [spec], progress=False)
