"""Detection and segmentation decoding: BBox/Detections, NMS against a brute-force
reference, MediaPipe SSD anchors against MediaPipe's own golden values, BlazeFace
(the real short-range model, run through edge_sdk's LiteRT backend) on real
photographs, YOLO on synthetic heads with known boxes, and segmentation maps
mapped back through letterbox (synthetic, and MediaPipe's selfie segmenter)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import edge_sdk
from edge_sdk.package import ImagePreprocess, TensorSpec
from edge_sdk.processing.detection import (
    BLAZEFACE_KEYPOINTS,
    BLAZEFACE_SHORT_RANGE_ANCHORS,
    BBox,
    Detection,
    Detections,
    blazeface_short_range_anchors,
    box_iou,
    decode_blazeface,
    decode_yolo,
    nms,
    ssd_anchors,
    weighted_nms,
)
from edge_sdk.processing.image import ImageTransform, preprocess_image
from edge_sdk.processing.segmentation import SegmentationMask, decode_segmentation


def _photo(name: str) -> np.ndarray:
    """A real photograph shipped with scikit-image (a dev dependency: a missing one fails
    these tests rather than skipping them; the pure-numpy tests here do not need it)."""
    import skimage.data

    return getattr(skimage.data, name)()


# --------------------------------------------------------------------------
# BBox


@pytest.mark.parametrize(
    "a, b, want",
    [
        ((0, 0, 10, 10), (0, 0, 10, 10), 1.0),  # identical
        ((0, 0, 10, 10), (5, 0, 15, 10), 50 / 150),  # half overlap along x
        ((0, 0, 10, 10), (10, 0, 20, 10), 0.0),  # touching edges: no area in common
        ((0, 0, 10, 10), (20, 20, 30, 30), 0.0),  # disjoint
        ((0, 0, 10, 10), (2, 2, 4, 4), 4 / 100),  # nested
        ((3, 3, 3, 3), (3, 3, 3, 3), 0.0),  # two zero-area boxes: union 0 -> 0, not NaN
    ],
)
def test_bbox_iou(a: tuple, b: tuple, want: float) -> None:
    assert BBox(*a).iou(BBox(*b)) == pytest.approx(want)
    assert BBox(*b).iou(BBox(*a)) == pytest.approx(want)  # symmetric
    assert box_iou([a], [b])[0, 0] == pytest.approx(want)


def test_bbox_properties_and_immutability() -> None:
    b = BBox(10, 20, 50, 40)
    assert (b.width, b.height, b.area, b.center) == (40.0, 20.0, 800.0, (30.0, 30.0))
    assert b.scale(0.5, 2).xyxy == (5.0, 40.0, 25.0, 80.0)
    assert b.translate(-10, 5).xyxy == (0.0, 25.0, 40.0, 45.0)
    assert b.contains(30, 30) and not b.contains(9, 30)
    assert BBox.from_xywh(1, 2, 3, 4).xyxy == (1.0, 2.0, 4.0, 6.0)
    assert isinstance(BBox(np.float32(1), 2, 3, 4).xmin, float)
    with pytest.raises(AttributeError):
        b.xmin = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((10, 0, 5, 5), ValueError, "xmin <= xmax"),  # inverted x
        ((0, 10, 5, 5), ValueError, "ymin <= ymax"),  # inverted y
        ((0, 0, math.nan, 5), ValueError, "finite"),
        ((0, 0, "5", 5), TypeError, "number"),
        ((0, 0, True, 5), TypeError, "number"),  # a bool is not a coordinate
    ],
)
def test_bbox_refuses(args: tuple, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        BBox(*args)
    with pytest.raises(ValueError, match="positive"):
        BBox(0, 0, 1, 1).scale(0, 1)


# --------------------------------------------------------------------------
# NMS against a brute-force reference


def _iou_ref(a: list[float], b: list[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1]) + max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms_reference(boxes: list, scores: list, thr: float, classes: list | None = None, cap: int | None = None) -> list[int]:
    """Textbook greedy NMS, one pair at a time: visit by (score desc, index asc); keep a box
    unless a kept box of the same class (or any class) overlaps it with IoU > thr."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    kept: list[int] = []
    for i in order:
        if cap is not None and len(kept) >= cap:
            break
        if all(_iou_ref(boxes[i], boxes[k]) <= thr or (classes is not None and classes[i] != classes[k]) for k in kept):
            kept.append(i)
    return kept


SQ = [0, 0, 10, 10]
NMS_CASES = [
    # (id, boxes, scores, thr, classes, max_detections, expected kept indices)
    ("empty", [], [], 0.5, None, None, []),
    ("single", [SQ], [0.3], 0.5, None, None, [0]),
    ("identical, different scores: best survives", [SQ, SQ], [0.4, 0.9], 0.5, None, None, [1]),
    ("identical, tied scores: lower index survives", [SQ, SQ, SQ], [0.5, 0.5, 0.5], 0.5, None, None, [0]),
    ("disjoint: all kept, best first", [SQ, [20, 0, 30, 10], [40, 0, 50, 10]], [0.2, 0.9, 0.5], 0.5, None, None, [1, 2, 0]),
    ("disjoint ties: index order", [SQ, [20, 0, 30, 10], [40, 0, 50, 10]], [0.5, 0.5, 0.5], 0.5, None, None, [0, 1, 2]),
    ("overlap above thr: suppressed", [SQ, [1, 0, 11, 10]], [0.9, 0.8], 0.5, None, None, [0]),
    ("class-aware: other class not suppressed", [SQ, [1, 0, 11, 10]], [0.9, 0.8], 0.5, [0, 1], None, [0, 1]),
    ("class-aware: same class suppressed", [SQ, [1, 0, 11, 10], [1, 1, 10, 10]], [0.9, 0.8, 0.7], 0.5, [0, 1, 0], None, [0, 1]),
    ("IoU exactly at thr survives (strict >)", [SQ, [5, 0, 15, 10]], [0.9, 0.8], 1 / 3, None, None, [0, 1]),
    (
        "greedy chain: A kills B, so C (only near B) lives",
        [[0, 0, 10, 10], [4, 0, 14, 10], [8, 0, 18, 10]],
        [0.9, 0.8, 0.7],
        0.4,
        None,
        None,
        [0, 2],
    ),
    ("thr 0: any overlap suppresses, touching does not", [SQ, [9, 0, 19, 10], [10, 0, 20, 10]], [0.9, 0.8, 0.7], 0.0, None, None, [0, 2]),
    ("thr 1: nothing suppressed", [SQ, SQ], [0.9, 0.8], 1.0, None, None, [0, 1]),
    ("zero-area boxes never overlap", [[5, 5, 5, 5], [5, 5, 5, 5]], [0.9, 0.8], 0.5, None, None, [0, 1]),
    ("max_detections caps the kept list", [SQ, [20, 0, 30, 10], [40, 0, 50, 10]], [0.2, 0.9, 0.5], 0.5, None, 2, [1, 2]),
]


@pytest.mark.parametrize("case", NMS_CASES, ids=[c[0] for c in NMS_CASES])
def test_nms_table(case: tuple) -> None:
    _, boxes, scores, thr, classes, cap, want = case
    got = nms(np.asarray(boxes, np.float32).reshape(-1, 4), scores, thr, class_ids=classes, max_detections=cap)
    assert got.dtype == np.int64
    assert got.tolist() == want
    assert want == nms_reference(boxes, scores, thr, classes, cap)  # the table agrees with the reference


def test_nms_matches_reference_on_random_boxes() -> None:
    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(0, 40))
        xy = rng.uniform(0, 100, (n, 2))
        wh = rng.uniform(0, 40, (n, 2))
        boxes = np.concatenate([xy, xy + wh], 1).round(1)  # rounding makes exact duplicates and ties likely
        scores = rng.choice([0.1, 0.5, 0.7, 0.9], n) if trial % 2 else rng.uniform(0, 1, n)
        classes = rng.integers(0, 3, n) if trial % 3 == 0 else None
        thr = float(rng.choice([0.0, 0.3, 0.5, 0.7]))
        cap = int(rng.integers(1, 10)) if trial % 5 == 0 else None
        want = nms_reference(boxes.tolist(), scores.tolist(), thr, None if classes is None else classes.tolist(), cap)
        assert nms(boxes, scores, thr, class_ids=classes, max_detections=cap).tolist() == want, trial


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"boxes": [[0, 0, 1]], "scores": [1.0]}, r"boxes: expected shape \[N, 4\]"),
        ({"boxes": [SQ], "scores": [1.0, 2.0]}, r"scores: expected shape \[1\]"),
        ({"boxes": [SQ], "scores": [math.nan]}, "finite"),
        ({"boxes": [SQ], "scores": [1.0], "iou_threshold": 1.5}, r"iou_threshold: expected a number in \[0, 1\]"),
        ({"boxes": [SQ], "scores": [1.0], "max_detections": 0}, "max_detections"),
        ({"boxes": [SQ], "scores": [1.0], "class_ids": [1, 2]}, r"class_ids: expected shape \[1\]"),
    ],
)
def test_nms_refuses(kwargs: dict, match: str) -> None:
    kwargs.setdefault("iou_threshold", 0.5)
    with pytest.raises(ValueError, match=match):
        nms(**kwargs)


def test_weighted_nms_blends_boxes_and_keypoints() -> None:
    boxes = np.array([[0, 0, 10, 10], [2, 0, 12, 10], [100, 100, 110, 110], [1, 0, 11, 10]], np.float32)
    scores = np.array([0.9, 0.1, 0.5, 0.3])
    kps = np.array([[[1, 1]], [[3, 1]], [[105, 105]], [[2, 2]]], np.float32)
    w = weighted_nms(boxes, scores, 0.3, keypoints=kps)
    assert w.indices.tolist() == [0, 2]  # leaders, best first
    # cluster of 0 holds 0, 1, 3 (IoU 0.67 and 0.82 with box 0); weights 0.9, 0.1, 0.3
    want = (boxes[0] * 0.9 + boxes[1] * 0.1 + boxes[3] * 0.3) / 1.3
    np.testing.assert_allclose(w.xyxy[0], want, rtol=1e-6)
    np.testing.assert_allclose(w.keypoints[0, 0], (kps[0, 0] * 0.9 + kps[1, 0] * 0.1 + kps[3, 0] * 0.3) / 1.3, rtol=1e-6)
    np.testing.assert_array_equal(w.xyxy[1], boxes[2])  # alone in its cluster: unchanged
    # class-aware: box 3 is another class and leads its own cluster
    wc = weighted_nms(boxes, scores, 0.3, class_ids=[0, 0, 0, 1])
    assert wc.indices.tolist() == [0, 2, 3] and wc.keypoints is None
    np.testing.assert_allclose(wc.xyxy[0], (boxes[0] * 0.9 + boxes[1] * 0.1) / 1.0, rtol=1e-6)
    # through Detections: score stays the leader's
    d = Detections(boxes, scores, [0, 0, 0, 0], keypoints=kps).nms(0.3, weighted=True)
    assert d.scores.tolist() == pytest.approx([0.9, 0.5]) and len(d) == 2
    assert weighted_nms(np.zeros((0, 4)), [], 0.3).xyxy.shape == (0, 4)


# --------------------------------------------------------------------------
# Detections


def _dets(n: int = 3, k: int | None = 2) -> Detections:
    xyxy = np.array([[0, 0, 10, 10], [5, 5, 25, 15], [30, 0, 40, 40]], np.float32)[:n]
    kp = None if k is None else np.arange(n * k * 2, dtype=np.float32).reshape(n, k, 2)
    return Detections(xyxy, np.array([0.9, 0.4, 0.7][:n]), np.array([1, 0, 1][:n]), ("b", "a", "b")[:n], kp)


def test_detections_indexing() -> None:
    d = _dets()
    assert len(d) == 3 and d.xyxy.dtype == np.float32 and d.scores.dtype == np.float32 and d.class_ids.dtype == np.int32
    m = d[d.scores > 0.5]
    assert len(m) == 2 and m.labels == ("b", "b") and m.keypoints.shape == (2, 2, 2)
    np.testing.assert_array_equal(m.xyxy, d.xyxy[[0, 2]])
    r = d[np.array([2, 0])]
    assert r.labels == ("b", "b") and r.scores.tolist() == pytest.approx([0.7, 0.9])
    assert d[1].labels == ("a",) and len(d[-1]) == 1 and len(d[1:]) == 2 and len(d[np.array([], int)]) == 0
    assert d.sorted().scores.tolist() == pytest.approx([0.9, 0.7, 0.4])
    assert d.areas().tolist() == [100.0, 200.0, 400.0]
    rows = list(d)
    assert isinstance(rows[0], Detection) and rows[0].bbox == BBox(0, 0, 10, 10) and rows[0].label == "b"
    assert rows[1].keypoints == ((4.0, 5.0), (6.0, 7.0))
    assert d.boxes()[2] == BBox(30, 0, 40, 40)
    with pytest.raises(IndexError, match=r"boolean mask: expected shape \[3\]"):
        d[np.array([True, False])]
    with pytest.raises(IndexError, match="out of range"):
        d[3]
    with pytest.raises(IndexError, match="outside"):
        d[np.array([0, 5])]
    with pytest.raises(IndexError, match="bool mask or int array"):
        d[np.array([0.5])]


def test_detections_are_immutable_copies() -> None:
    src = np.array([[0, 0, 1, 1]], np.float32)
    d = Detections(src, [0.5], [0])
    src[0, 0] = 99  # the caller's array is not shared
    assert d.xyxy[0, 0] == 0 and d.labels == ("0",)  # labels default to str(class_id)
    with pytest.raises(ValueError, match="read-only"):
        d.xyxy[0, 0] = 1
    with pytest.raises(AttributeError):
        d.scores = np.zeros(1)  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"xyxy": np.zeros((2, 3))}, ValueError, r"xyxy: expected shape \[N, 4\], got \[2, 3\]"),
        ({"scores": np.zeros(3)}, ValueError, r"scores: expected shape \[2\], got \[3\]"),
        ({"class_ids": np.zeros(2, np.float32)}, TypeError, "class_ids: expected integers"),
        ({"class_ids": np.zeros(3, int)}, ValueError, r"class_ids: expected shape \[2\]"),
        ({"labels": ("a",)}, ValueError, "expected 2 names"),
        ({"labels": "ab"}, TypeError, "one str"),
        ({"keypoints": np.zeros((2, 6, 3))}, ValueError, r"keypoints: expected shape \[2, K, 2\]"),
        ({"xyxy": np.full((2, 4), np.inf)}, ValueError, "finite"),
        ({"xyxy": [[0, 0, 1, 1], [5, 0, 4, 1]]}, ValueError, r"x1 <= x2 and y1 <= y2, row 1"),
        ({"scores": np.array(["a", "b"])}, TypeError, "numeric"),
    ],
)
def test_detections_refuse_bad_shapes(kwargs: dict, exc: type, match: str) -> None:
    base: dict[str, Any] = {"xyxy": np.zeros((2, 4)), "scores": np.zeros(2), "class_ids": np.zeros(2, int)}
    base.update(kwargs)
    with pytest.raises(exc, match=match):
        Detections(**base)


def test_detections_empty_merge_to_dict() -> None:
    e = Detections.empty()
    assert len(e) == 0 and e.xyxy.shape == (0, 4) and e.keypoints is None and e.boxes() == ()
    assert Detections.empty(num_keypoints=6).keypoints.shape == (0, 6, 2)
    d = _dets()
    m = Detections.merge([d[:1], Detections.empty(), d[1:]])  # empty items are skipped
    np.testing.assert_array_equal(m.xyxy, d.xyxy)
    np.testing.assert_array_equal(m.keypoints, d.keypoints)
    assert m.labels == d.labels
    assert len(Detections.merge([])) == 0
    with pytest.raises(ValueError, match="keypoints disagree"):
        Detections.merge([_dets(k=2), _dets(k=None)])
    with pytest.raises(TypeError, match="expected Detections"):
        Detections.merge([d, "x"])  # type: ignore[list-item]
    out = d[:1].to_dict()
    assert out == {
        "detections": [
            {
                "xyxy": [0.0, 0.0, 10.0, 10.0],
                "score": pytest.approx(0.9),
                "class_id": 1,
                "label": "b",
                "keypoints": [[0.0, 1.0], [2.0, 3.0]],
            }
        ]
    }
    assert d.nms(0.05, class_aware=False).labels == ("b", "b")  # box 1 overlaps box 0 (IoU 0.07): gone
    assert len(d.nms(0.05)) == 3  # class-aware: box 1 is class 0, alone


# --------------------------------------------------------------------------
# SSD anchors


def test_ssd_anchors_match_mediapipe_golden_values() -> None:
    """MediaPipe's ssd_anchors_calculator_test.cc "MobileSSDConfig" options; the rows are
    from its testdata/anchor_golden_file_1.txt (x_center y_center w h): the first three
    (19x19 lowest layer, reduced boxes) and the last six (the 1x1 layer)."""
    a = ssd_anchors(
        input_size_hw=(300, 300), num_layers=6, min_scale=0.2, max_scale=0.95,
        strides=(16, 32, 64, 128, 256, 512), aspect_ratios=(1.0, 2.0, 0.5, 3.0, 0.3333),
        reduce_boxes_in_lowest_layer=True,
    )  # fmt: skip
    assert a.shape == (1917, 4) and a.dtype == np.float32
    golden_head = [
        [0.0263158, 0.0263158, 0.1, 0.1],
        [0.0263158, 0.0263158, 0.282843, 0.141421],
        [0.0263158, 0.0263158, 0.141421, 0.282843],
    ]
    golden_tail = [
        [0.5, 0.5, 0.95, 0.95],
        [0.5, 0.5, 1.3435, 0.671751],
        [0.5, 0.5, 0.671751, 1.3435],
        [0.5, 0.5, 1.64545, 0.548483],
        [0.5, 0.5, 0.548455, 1.64553],
        [0.5, 0.5, 0.974679, 0.974679],
    ]
    np.testing.assert_allclose(a[:3], golden_head, atol=1e-5)  # MediaPipe's test tolerance
    np.testing.assert_allclose(a[-6:], golden_tail, atol=1e-5)
    np.testing.assert_allclose(a[3], [0.0789474, 0.0263158, 0.1, 0.1], atol=1e-5)  # x varies fastest


def test_blazeface_short_range_anchors() -> None:
    a = blazeface_short_range_anchors()
    assert a.shape == (896, 4) and not a.flags.writeable
    assert a is blazeface_short_range_anchors()  # cached
    # 16x16 cells x 2 anchors (stride 8), then 8x8 x 6 (three stride-16 layers merged)
    np.testing.assert_allclose(a[0], [0.5 / 16, 0.5 / 16, 1, 1])
    np.testing.assert_allclose(a[1], a[0])
    np.testing.assert_allclose(a[2], [1.5 / 16, 0.5 / 16, 1, 1])
    np.testing.assert_allclose(a[511], [15.5 / 16, 15.5 / 16, 1, 1])
    np.testing.assert_allclose(a[512:518], [[0.5 / 8, 0.5 / 8, 1, 1]] * 6)
    np.testing.assert_allclose(a[-1], [7.5 / 8, 7.5 / 8, 1, 1])
    assert BLAZEFACE_SHORT_RANGE_ANCHORS["strides"] == (8, 16, 16, 16)
    with pytest.raises(ValueError, match="expected 4 strides"):
        ssd_anchors(**{**BLAZEFACE_SHORT_RANGE_ANCHORS, "strides": (8, 16)})


def test_decode_blazeface_synthetic_box() -> None:
    """One anchor fires: offsets are input pixels, x before y (MediaPipe reverse_output_order)."""
    anchors = blazeface_short_range_anchors()
    reg = np.zeros((1, 896, 16), np.float32)
    cls = np.full((1, 896, 1), -20.0, np.float32)
    i = 2 * (16 * 5 + 3)  # first anchor of cell (row 5, col 3) on the stride-8 grid: centre (28, 44) px
    reg[0, i, :4] = [4.0, -2.0, 20.0, 30.0]  # centre +4 px x, -2 px y; 20 wide, 30 tall
    reg[0, i, 4:6] = [-5.0, -6.0]  # first keypoint relative to the anchor centre
    cls[0, i, 0] = 3.0
    d = decode_blazeface(reg, cls, anchors, input_size=128)
    assert len(d) == 1 and d.labels == ("face",) and d.keypoints.shape == (1, 6, 2)
    np.testing.assert_allclose(d.xyxy[0], [32 - 10, 42 - 15, 32 + 10, 42 + 15], atol=1e-4)
    np.testing.assert_allclose(d.keypoints[0, 0], [28 - 5, 44 - 6], atol=1e-4)
    assert d.scores[0] == pytest.approx(1 / (1 + math.exp(-3)))
    tf = ImageTransform(source_hw=(256, 512), scale_xy=(0.25, 0.25), pad_xy=(0.0, 32.0))  # 512x256 letterboxed
    s = decode_blazeface(reg, cls, anchors, input_size=128, transform=tf, clip=False)
    np.testing.assert_allclose(s.xyxy[0], [22 * 4, (27 - 32) * 4, 42 * 4, (57 - 32) * 4], atol=1e-3)
    np.testing.assert_allclose(s.keypoints[0, 0], [23 * 4, (38 - 32) * 4], atol=1e-3)
    c = decode_blazeface(reg, cls, anchors, input_size=128, transform=tf)  # clipped to the 512x256 frame
    np.testing.assert_allclose(c.xyxy[0], [88, 0, 168, 100], atol=1e-3)
    with pytest.raises(ValueError, match=r"anchors: expected \[896, 4\]"):
        decode_blazeface(reg, cls, anchors[:10])
    with pytest.raises(ValueError, match="one image at a time"):
        decode_blazeface(np.zeros((2, 896, 16)), np.zeros((2, 896, 1)))


def test_decode_blazeface_results_are_frozen_and_bad_boxes_are_still_refused() -> None:
    """The decoder hands its own fresh arrays to Detections without the constructor's copies; the
    box checks (finite, x1 <= x2) must still run, and the arrays must still be read-only."""
    reg = np.zeros((1, 896, 16), np.float32)
    reg[0, :, 2:4] = 10.0
    cls = np.full((1, 896, 1), -20.0, np.float32)
    cls[0, 7, 0] = cls[0, 300, 0] = 4.0
    d = decode_blazeface(reg, cls)
    assert len(d) == 2 and all(not a.flags.writeable for a in (d.xyxy, d.scores, d.class_ids, d.keypoints))
    assert d.xyxy.dtype == np.float32 and d.class_ids.dtype == np.int32 and d.scores.dtype == np.float32
    with pytest.raises(ValueError, match="x1 <= x2"):  # a mirroring transform flips every box
        decode_blazeface(reg, cls, transform=ImageTransform(source_hw=(480, 640), scale_xy=(-0.2, 0.2), pad_xy=(0.0, 0.0)), clip=False)
    with pytest.raises(ValueError, match="finite"), np.errstate(divide="ignore"):  # a zero scale maps the boxes to infinity
        decode_blazeface(reg, cls, transform=ImageTransform(source_hw=(480, 640), scale_xy=(0.0, 0.2), pad_xy=(1.0, 0.0)), clip=False)
    reg[0, 7, 0] = np.nan
    with pytest.raises(ValueError, match="weighted_nms: boxes and scores must be finite"):
        decode_blazeface(reg, cls)


# --------------------------------------------------------------------------
# BlazeFace short-range, the real model on real photographs

FACE_MODEL = "mediapipe-face-detection-short-range"
# The astronaut's face in skimage.data.astronaut() (512x512), xyxy in pixels, determined once by
# hand (independently of the model) on a 5x zoom with a 10 px grid: cheeks at x ~182 and ~270,
# hairline y ~80 / brows ~90, chin y ~176. Pupils: (203, 102) on the image's left (her right
# eye) and (246, 103); nose tip ~(224, 128), mouth centre ~(224, 145).
ASTRONAUT_FACE = BBox(182, 82, 270, 176)
ASTRONAUT_EYES = ((203, 102), (246, 103))


@pytest.fixture(scope="module")
def face_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[edge_sdk.Model]:
    """BlazeFace short-range packaged with its preprocessing declared (RGB 128x128 letterbox,
    [-1, 1] floats, black padding as MediaPipe's BORDER_ZERO) and loaded through the LiteRT backend."""
    from converters.packaging import write_package
    from tools.fixtures.fetch_pretrained import fetch

    path = fetch(FACE_MODEL)  # raises FetchError (fails the test) when the network is missing
    root = tmp_path_factory.mktemp("face") / "pkg"
    write_package(
        root,
        {
            "name": "face-detection-short-range",
            "version": "0.10.21",
            "task": "detection",
            "inputs": [
                {
                    "name": "input",
                    "dtype": "float32",
                    "shape": [1, 128, 128, 3],
                    "layout": "NHWC",
                    "preprocess": {
                        "kind": "image",
                        "size_hw": [128, 128],
                        "resize": "letterbox",
                        "color": "RGB",
                        "mean": [0.5, 0.5, 0.5],
                        "std": [0.5, 0.5, 0.5],
                        "pad_value": 0,
                    },
                }
            ],
            "outputs": [
                {"name": "regressors", "dtype": "float32", "shape": [1, 896, 16]},
                {"name": "classificators", "dtype": "float32", "shape": [1, 896, 1]},
            ],
            "variants": [{"id": "fp32-tflite", "file": "face.tflite", "backend": "litert", "precision": "fp32"}],
        },
        {"face.tflite": path},
    )
    opts = edge_sdk.LoadOptions(delegates=(), cache_dir=tmp_path_factory.mktemp("cache"))
    with edge_sdk.load(root, "raspberry-pi-5", opts) as m:
        yield m


def _faces(model: edge_sdk.Model, img: np.ndarray, **kw: Any) -> Detections:
    r = model.predict_image(img)
    assert isinstance(r.transform, ImageTransform)
    return decode_blazeface(
        r.outputs["regressors"], r.outputs["classificators"], blazeface_short_range_anchors(),
        input_size=(128, 128), transform=r.transform, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("threshold", [0.5, 0.75, 1e-9, 1 - 1e-9, 0.0, 1.0])
def test_decode_blazeface_keeps_exactly_the_anchors_whose_score_reaches_the_threshold(threshold: float) -> None:
    """Only logits near or over log(t / (1 - t)) are scored; the kept set and scores must be those
    of scoring all 896, also for logits a float32 ulp either side of the cut."""
    rng = np.random.default_rng(3)
    reg = rng.normal(0, 3, (1, 896, 16)).astype(np.float32)
    reg[0, :, 2:4] = np.abs(reg[0, :, 2:4]) + 1  # positive sizes: no box dropped for its size
    logits = rng.normal(0, 4, 896).astype(np.float32)
    if 0 < threshold < 1:
        cut = np.float32(math.log(threshold / (1 - threshold)))
        logits[:30] = cut
        logits[30:60] = np.nextafter(cut, np.float32(-np.inf))
        logits[60:90] = np.nextafter(cut, np.float32(np.inf))
    logits[90:95] = [np.nan, np.inf, -np.inf, 200.0, -200.0]
    cls = logits.reshape(1, 896, 1)
    scores = 1.0 / (1.0 + np.exp(-np.clip(logits.astype(np.float64), -100, 100)))  # every anchor scored
    want = np.flatnonzero(scores >= threshold)
    got = decode_blazeface(reg, cls, score_threshold=threshold, weighted=False, iou_threshold=1.0, clip=False)  # none suppressed
    assert len(got) == want.size
    np.testing.assert_array_equal(np.sort(got.scores), np.sort(scores[want].astype(np.float32)))


def test_blazeface_finds_the_astronaut(face_model: edge_sdk.Model) -> None:
    faces = _faces(face_model, _photo("astronaut"))
    assert len(faces) == 1, faces.to_dict()
    f = next(iter(faces))
    assert f.label == "face" and f.score > 0.8
    assert f.bbox.iou(ASTRONAUT_FACE) >= 0.75, (f.bbox, ASTRONAUT_FACE)  # measured 0.92
    kp = dict(zip(BLAZEFACE_KEYPOINTS, f.keypoints))
    for name, (hx, hy) in zip(("right_eye", "left_eye"), ASTRONAUT_EYES):
        x, y = kp[name]
        assert f.bbox.contains(x, y), (name, kp[name], f.bbox)
        assert math.hypot(x - hx, y - hy) < 10, (name, kp[name], (hx, hy))  # within ~10% of the face width
    assert kp["right_eye"][0] < kp["nose_tip"][0] < kp["left_eye"][0]  # her right eye is on the image's left
    assert kp["right_eye"][1] < kp["nose_tip"][1] < kp["mouth_center"][1]
    plain = _faces(face_model, _photo("astronaut"), weighted=False)  # plain NMS keeps the same face
    assert len(plain) == 1 and plain.boxes()[0].iou(f.bbox) > 0.9


@pytest.mark.parametrize("photo", ["coffee", "rocket"])
def test_blazeface_no_face(face_model: edge_sdk.Model, photo: str) -> None:
    img = _photo(photo)
    assert len(_faces(face_model, img)) == 0
    r = face_model.predict_image(img)
    assert (1 / (1 + np.exp(-np.clip(r.outputs["classificators"].astype(np.float64), -100, 100)))).max() < 0.5  # no anchor above 0.5 at all


@pytest.mark.parametrize(
    "canvas_hw, at_yx",
    [
        ((256, 512), (0, 192)),  # wide canvas: letterbox pads top and bottom (pad_y = 32)
        ((512, 256), (192, 0)),  # tall canvas: letterbox pads left and right (pad_x = 32)
    ],
)
def test_blazeface_through_letterbox_maps_back(face_model: edge_sdk.Model, canvas_hw: tuple, at_yx: tuple) -> None:
    """A 256x256 crop around the face pasted into a black canvas: the letterbox now pads, and
    boxes mapped back through the transform land within a few pixels of the direct result.
    Both inputs are downscaled 4x (the photo is 512x512, the canvas 512 on its long side) and the
    face moves by a multiple of 16 model pixels (the coarsest anchor stride), so the model sees
    the same face pixels on the same anchor grid; only the context and the transform differ."""
    img = _photo("astronaut")
    direct = _faces(face_model, img)
    assert len(direct) == 1
    crop_y, crop_x = 0, 64
    crop = img[crop_y : crop_y + 256, crop_x : crop_x + 256]
    canvas = np.zeros((*canvas_hw, 3), np.uint8)
    canvas[at_yx[0] : at_yx[0] + 256, at_yx[1] : at_yx[1] + 256] = crop
    r = face_model.predict_image(canvas)
    assert max(r.transform.pad_xy) == 32.0 and r.transform.scale_xy == (0.25, 0.25)
    boxed = _faces(face_model, canvas)
    assert len(boxed) == 1
    dx, dy = crop_x - at_yx[1], crop_y - at_yx[0]  # canvas pixel -> photo pixel
    back = boxed.xyxy[0] + np.array([dx, dy, dx, dy], np.float32)
    np.testing.assert_allclose(back, direct.xyxy[0], atol=2.0)  # measured <= 0.5 px
    np.testing.assert_allclose(boxed.keypoints[0] + np.array([dx, dy], np.float32), direct.keypoints[0], atol=3.0)  # measured <= 1.5 px
    # and the transform is what matters: ignoring it leaves the box in model pixels, far off
    raw = decode_blazeface(r.outputs["regressors"], r.outputs["classificators"], input_size=128)
    assert BBox(*raw.xyxy[0]).iou(BBox(*(direct.xyxy[0] - [dx, dy, dx, dy]))) < 0.1


# --------------------------------------------------------------------------
# YOLO

LABELS = ("person", "car", "dog")


def _v5_rows() -> np.ndarray:
    """[N, 5 + 3]: cx, cy, w, h, obj, class probs. Two real objects, a duplicate, a weak one."""
    return np.array(
        [
            [100, 100, 40, 80, 0.9, 0.95, 0.03, 0.02],  # person at (80, 60, 120, 140), score 0.855
            [102, 101, 40, 80, 0.8, 0.90, 0.05, 0.05],  # the same person again (IoU 0.92): suppressed
            [300, 200, 100, 50, 0.95, 0.1, 0.85, 0.05],  # car at (250, 175, 350, 225), score 0.8075
            [500, 500, 20, 20, 0.2, 0.1, 0.1, 0.8],  # dog, 0.16: under the threshold
        ],
        np.float32,
    )


def test_decode_yolo_v5_layout() -> None:
    d = decode_yolo(_v5_rows()[None], layout="xywh+obj+classes", score_threshold=0.25, iou_threshold=0.45, labels=LABELS)
    assert d.labels == ("person", "car") and d.class_ids.tolist() == [0, 1]
    np.testing.assert_allclose(d.xyxy, [[80, 60, 120, 140], [250, 175, 350, 225]])
    np.testing.assert_allclose(d.scores, [0.9 * 0.95, 0.95 * 0.85], rtol=1e-6)
    low = decode_yolo(_v5_rows()[None], layout="xywh+obj+classes", score_threshold=0.1, labels=LABELS)
    assert low.labels == ("person", "car", "dog")
    # class-agnostic NMS lets a same-place box of another class suppress
    rows = _v5_rows()[:2].copy()
    rows[1, 5:] = [0.0, 0.9, 0.0]  # the duplicate is now a "car"
    assert len(decode_yolo(rows[None], layout="xywh+obj+classes", labels=LABELS)) == 2
    assert len(decode_yolo(rows[None], layout="xywh+obj+classes", labels=LABELS, class_aware=False)) == 1
    # logits in, sigmoid applied
    p = np.clip(rows, 1e-6, 1 - 1e-6)
    logit = np.log(p / (1 - p))
    logit[:, :4] = rows[:, :4]
    s = decode_yolo(logit[None], layout="xywh+obj+classes", labels=LABELS, apply_sigmoid=True)
    np.testing.assert_allclose(s.scores, [0.9 * 0.95, 0.8 * 0.9], rtol=1e-4)


def test_decode_yolo_v8_layout_with_letterbox() -> None:
    """[1, 4 + C, N] as Ultralytics exports it, decoded back through a letterbox transform made by
    preprocess_image for a 320x640 frame into 640x640 (scale 1, 160 px bands top and bottom)."""
    spec = TensorSpec("images", "float32", (1, 3, 640, 640), "NCHW", preprocess=ImagePreprocess(size_hw=(640, 640), resize="letterbox"))
    _, tf = preprocess_image(np.zeros((320, 640, 3), np.uint8), spec)
    assert tf.pad_xy == (0.0, 160.0) and tf.scale_xy == (1.0, 1.0)
    rows = np.array(
        [
            [320, 260, 100, 40, 0.05, 0.90, 0.01],  # car at model (270, 240, 370, 280) -> source y - 160
            [100, 200, 50, 100, 0.70, 0.10, 0.05],  # person at model (75, 150, 125, 250): crosses the band, clipped to y >= 0
            [600, 600, 10, 10, 0.01, 0.02, 0.10],  # nothing above 0.25
        ],
        np.float32,
    )
    out = rows.T[None]  # [1, 7, 3]
    d = decode_yolo(out, layout="xywh+classes", labels=LABELS, transform=tf)
    assert d.labels == ("car", "person")
    np.testing.assert_allclose(d.xyxy, [[270, 80, 370, 120], [75, 0, 125, 90]])
    np.testing.assert_allclose(d.scores, [0.9, 0.7], rtol=1e-6)
    unclipped = decode_yolo(out, layout="xywh+classes", labels=LABELS, transform=tf, clip=False)
    np.testing.assert_allclose(unclipped.xyxy[1], [75, -10, 125, 90])
    # the same head transposed ([1, N, 4 + C]) and without labels: the smaller axis is the channel axis
    wide = np.concatenate([rows, np.zeros((20, 7), np.float32)])  # 23 boxes, 7 channels
    t = decode_yolo(wide[None], layout="xywh+classes")
    assert t.labels == ("1", "0") and len(decode_yolo(wide.T[None], layout="xywh+classes")) == 2
    # normalised coordinates need the input size
    norm = rows.copy()
    norm[:, :4] /= 640
    n = decode_yolo(norm.T[None], layout="xywh+classes", labels=LABELS, normalized=True, input_size=640)
    np.testing.assert_allclose(n.xyxy, [[270, 240, 370, 280], [75, 150, 125, 250]], rtol=1e-5)


def test_decode_yolo_end_to_end_layout_and_errors() -> None:
    e2e = np.array([[[10, 10, 50, 50, 0.9, 2], [0, 0, 5, 5, 0.1, 0], [12, 12, 52, 52, 0.8, 2]]], np.float32)
    d = decode_yolo(e2e, layout="xyxy+score+class", labels=LABELS)
    assert d.labels == ("dog", "dog")  # no NMS here: the model already ran it
    assert d.class_ids.dtype == np.int32
    empty = decode_yolo(e2e, layout="xyxy+score+class", score_threshold=0.95)
    assert len(empty) == 0 and empty.xyxy.shape == (0, 4)
    for out, kw, match in [
        (e2e, {"layout": "yolo"}, "layout: expected one of"),
        (np.zeros((2, 3, 8)), {"layout": "xywh+obj+classes"}, "one image at a time"),
        (np.zeros((3, 5)), {"layout": "xywh+obj+classes"}, r"needs \[1, N, 5 \+ C\]"),
        (np.zeros((1, 6, 6)), {"layout": "xywh+classes"}, "cannot tell boxes from channels"),
        (np.zeros((1, 9, 30)), {"layout": "xywh+classes", "labels": LABELS}, r"no axis of size 4 \+ 3"),
        (np.zeros((1, 7, 30)), {"layout": "xywh+classes", "normalized": True}, "needs input_size"),
    ]:
        with pytest.raises(ValueError, match=match):
            decode_yolo(out, **kw)


# --------------------------------------------------------------------------
# segmentation


def _letterbox_tf(src_hw: tuple[int, int], size: int) -> ImageTransform:
    spec = TensorSpec("x", "float32", (1, size, size, 3), "NHWC", preprocess=ImagePreprocess(size_hw=(size, size), resize="letterbox"))
    return preprocess_image(np.zeros((*src_hw, 3), np.uint8), spec)[1]


def test_segmentation_letterbox_undo_exact_rectangle() -> None:
    """A 200x400 frame letterboxed into 128x128 (scale 0.32, 32 px bands top and bottom).
    The source rectangle x 100..300, y 50..150 is model x 32..96, y 48..80."""
    tf = _letterbox_tf((200, 400), 128)
    assert tf.scale_xy == (0.32, 0.32) and tf.pad_xy == (0.0, 32.0)
    logits = np.zeros((1, 128, 128, 3), np.float32)
    logits[0, :, :, 0] = 1.0  # background
    logits[0, 48:80, 32:96, 1] = 5.0  # the rectangle
    logits[0, :32, :, 2] = 9.0  # the padding bands: must be cut away, never seen in the result
    logits[0, 96:, :, 2] = 9.0
    for up in ("nearest", "bilinear"):
        seg = decode_segmentation(logits, layout="NHWC", transform=tf, labels=("bg", "box", "pad"), upsample=up)
        assert seg.shape_hw == (200, 400) and seg.class_map.dtype == np.uint8
        want = np.zeros((200, 400), bool)
        want[50:150, 100:300] = True
        got = seg.mask("box")
        assert not seg.mask("pad").any()
        if up == "nearest":
            np.testing.assert_array_equal(got, want)
        else:  # bilinear blends across the edge: at most a 2-px border differs
            assert (got != want).sum() <= 2 * 2 * (100 + 200)
            assert got[52:148, 102:298].all() and not got[:48].any() and not got[:, :98].any()
    # NCHW logits at half the input resolution (stride 2): the map is scaled as well as unpadded
    half = logits[:, ::2, ::2, :].transpose(0, 3, 1, 2)  # [1, 3, 64, 64]
    seg = decode_segmentation(
        half, layout="NCHW", transform=tf, input_size=128, upsample="nearest", activation="softmax", keep_probabilities=True
    )
    np.testing.assert_array_equal(seg.mask(1), want)
    assert seg.probabilities.shape == (200, 400, 3) and seg.probabilities.dtype == np.float32
    np.testing.assert_allclose(seg.probabilities.sum(2), 1.0, rtol=1e-5)
    assert seg.labels == () and seg.label(1) == "1"


def test_segmentation_binary_and_index_map() -> None:
    tf = _letterbox_tf((200, 400), 128)
    prob = np.zeros((1, 128, 128, 1), np.float32)
    prob[0, 48:80, 32:96, 0] = 0.8
    prob[0, 48:80, 32:64, 0] = 0.4  # left half under the 0.5 threshold
    seg = decode_segmentation(prob, layout="NHWC", transform=tf, upsample="nearest")
    assert seg.labels == ("background", "foreground")
    want = np.zeros((200, 400), bool)
    want[50:150, 200:300] = True
    np.testing.assert_array_equal(seg.mask("foreground"), want)
    low = decode_segmentation(prob, layout="NHWC", transform=tf, threshold=0.3, upsample="nearest")
    assert low.mask(1).sum() == 100 * 200
    logit = np.log(np.clip(prob, 1e-6, 1) / np.clip(1 - prob, 1e-6, 1))
    lg = decode_segmentation(logit, layout="NHWC", transform=tf, activation="sigmoid", upsample="nearest", keep_probabilities=True)
    np.testing.assert_array_equal(lg.mask(1), want)
    assert lg.probabilities.shape == (200, 400, 1) and lg.probabilities.max() == pytest.approx(0.8, abs=1e-4)
    # class-index map (ArgMax inside the model)
    idx = np.zeros((1, 128, 128), np.int64)
    idx[0, 48:80, 32:96] = 7
    im = decode_segmentation(idx, layout="NHW", transform=tf)
    np.testing.assert_array_equal(im.mask(7), np.pad(np.ones((100, 200), bool), ((50, 50), (100, 100))))
    assert im.pixel_counts() == {"0": 200 * 400 - 100 * 200, "7": 100 * 200}
    assert im.to_dict()["shape_hw"] == [200, 400]
    # no transform: the map stays at output size
    assert decode_segmentation(prob[0], layout="NHWC").shape_hw == (128, 128)
    with pytest.raises(KeyError, match="unknown label"):
        seg.mask("cat")
    with pytest.raises(ValueError, match="read-only"):
        seg.class_map[0, 0] = 1


@pytest.mark.parametrize(
    "out, kw, match",
    [
        (np.zeros((1, 3, 8, 8)), {"layout": "NHCW"}, "layout: expected one of"),
        (np.zeros((8, 8)), {"layout": "NHWC"}, "expected rank 4"),
        (np.zeros((2, 8, 8, 3)), {"layout": "NHWC"}, "one image at a time"),
        (np.zeros((1, 8, 8), np.float32), {"layout": "NHW"}, "integer dtype"),
        (np.full((1, 8, 8), -1), {"layout": "NHW"}, "negative values"),
        (np.zeros((1, 8, 8, 1)), {"layout": "NHWC", "activation": "softmax"}, "softmax over one channel"),
        (np.full((1, 8, 8, 2), np.nan), {"layout": "NHWC"}, "NaN"),
        (np.zeros((1, 8, 8, 2)), {"layout": "NHWC", "threshold": 2.0}, "threshold"),
        (np.zeros((1, 8, 8, 2)), {"layout": "NHWC", "upsample": "cubic"}, "upsample"),
    ],
)
def test_segmentation_refuses(out: np.ndarray, kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_segmentation(out, **kw)
    with pytest.raises(ValueError, match=r"class_map: expected shape \[H, W\]"):
        SegmentationMask(np.zeros((2, 2, 2), np.uint8))


def test_selfie_segmentation_on_the_astronaut(tmp_path: Path) -> None:
    """MediaPipe's selfie segmenter (real model, [1, 256, 256, 1] person probability) on the
    astronaut, directly and pasted into a wide black canvas (letterbox pads 55 px top and bottom):
    the mask maps back onto her face in both, and nothing lands on the canvas's empty sides."""
    from ai_edge_litert.interpreter import Interpreter

    from tools.fixtures.fetch_pretrained import fetch

    it = Interpreter(model_path=str(fetch("mediapipe-selfie-segmentation")))
    it.allocate_tensors()
    spec = TensorSpec(
        "input_1", "float32", (1, 256, 256, 3), "NHWC", preprocess=ImagePreprocess(size_hw=(256, 256), resize="letterbox", pad_value=0)
    )

    def person(img: np.ndarray) -> SegmentationMask:
        x, tf = preprocess_image(img, spec)
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        return decode_segmentation(it.get_tensor(it.get_output_details()[0]["index"]), layout="NHWC", transform=tf)

    img = _photo("astronaut")
    canvas = np.zeros((512, 900, 3), np.uint8)
    canvas[:, 200:712] = img
    direct, wide = person(img), person(canvas)
    assert wide.shape_hw == (512, 900)
    f = ASTRONAUT_FACE
    face = (slice(int(f.ymin), int(f.ymax)), slice(int(f.xmin), int(f.xmax)))
    assert direct.mask("foreground")[face].mean() > 0.9
    assert wide.mask("foreground")[:, 200:712][face].mean() > 0.9  # measured 0.97; a wrong pad_y misses the face
    assert not direct.mask(1)[0:60, 300:370].any()  # grey backdrop between her head and the shuttle
    assert not wide.mask(1)[:, :190].any() and not wide.mask(1)[:, 720:].any()


def test_every_keypoint_name_is_unique() -> None:
    assert len(set(BLAZEFACE_KEYPOINTS)) == 6
    assert list(itertools.islice(BLAZEFACE_KEYPOINTS, 2)) == ["right_eye", "left_eye"]
