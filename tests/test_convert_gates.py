"""Task-appropriate quality figures and gates (converters/validate.py): sequence (CTC) agreement,
detection box recall/IoU against the reference's boxes, segmentation mask IoU; the manifest's Quality
stays backward compatible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.pipeline import ConvertOptions, convert
from converters.validate import (
    box_agreement,
    check_gate,
    compare,
    ctc_decode,
    default_gate,
    edit_distance,
    mask_iou,
    parse_gate,
    sequence_figures,
)
from edge_sdk.errors import ManifestError
from edge_sdk.package import Gate, Quality


def onehot(ids: list[list[int]], classes: int = 5) -> np.ndarray:
    a = np.full((len(ids), len(ids[0]), classes), 0.01, np.float32)
    for b, row in enumerate(ids):
        for t, k in enumerate(row):
            a[b, t, k] = 0.9
    return a


def test_ctc_decode_and_edit_distance() -> None:
    assert ctc_decode(np.array([0, 1, 1, 0, 1, 2, 2, 0])) == [1, 1, 2]  # a blank between repeats keeps both
    assert ctc_decode(np.array([3, 3, 3]), blank=3) == []
    assert ctc_decode(np.array([1, 1, 2]), blank=2) == [1]
    assert edit_distance([1, 2, 3], [1, 3]) == 1 and edit_distance([], [4, 4]) == 2 and edit_distance([1, 2], [2, 1]) == 2


def test_sequence_figures() -> None:
    ref = [onehot([[0, 1, 1, 0, 2]]), onehot([[3, 0, 3, 0, 0]])]
    same_text = [onehot([[1, 1, 0, 0, 2]]), onehot([[3, 0, 3, 0, 0]])]  # positions differ, decoded text the same
    f = sequence_figures(ref, same_text)
    assert f["sequence_exact_match"] == 1.0 and f["edit_distance"] == 0.0 and f["position_agreement"] == pytest.approx(8 / 10)
    one_char = [onehot([[0, 1, 1, 0, 4]]), onehot([[3, 0, 3, 0, 0]])]  # "1 2" -> "1 4": 1 edit over 2
    f = sequence_figures(ref, one_char)
    assert f["sequence_exact_match"] == 0.5 and f["edit_distance"] == pytest.approx(0.25)
    # blank 4 instead of 0: "0 1 1 0 2" decodes to 0 1 0 2 against 0 1 0 (4 is blank)
    assert sequence_figures(ref, one_char, blank=4)["sequence_exact_match"] == 0.5


def test_compare_sequence_task_with_varying_lengths() -> None:
    """Outputs as per-sample lists (each line its own width): the sequence figures and cosine still come out."""
    ref = {"probs": [onehot([[0, 1, 1, 0, 2]]), onehot([[2, 2, 0]])]}
    got = {"probs": [onehot([[0, 1, 0, 0, 2]]), onehot([[2, 2, 0]])]}
    c = compare(ref, got, task="sequence", class_output=None, labels=None, reference_id="fp32", dataset="d")
    q = c.quality
    assert q.sequence_exact_match == 1.0 and q.edit_distance == 0.0 and q.position_agreement == pytest.approx(7 / 8)
    assert q.cosine is not None and q.cosine < 1.0 and q.top1_agreement is None
    ok, fails = check_gate(q, default_gate("sequence"))
    assert ok and not fails
    bad = {"probs": [onehot([[0, 3, 3, 0, 3]]), onehot([[1, 1, 0]])]}
    q = compare(ref, bad, task="sequence", class_output=None, labels=None, reference_id="fp32", dataset="d").quality
    ok, fails = check_gate(q, default_gate("sequence"))
    assert not ok and any("edit_distance" in f and ">" in f for f in fails)  # a maximum


def test_box_agreement_and_compare_detection_rows() -> None:
    r = np.array([[0, 0, 10, 10, 0.9, 1], [20, 20, 30, 30, 0.8, 0]], np.float64)
    shifted = r.copy()
    shifted[0, :4] += [1, 0, 1, 0]  # IoU 90/110
    rec, iou, prec, n = box_agreement([r], [shifted])
    assert (rec, prec, n) == (1.0, 1.0, 2) and iou == pytest.approx((90 / 110 + 1.0) / 2)
    wrong_class = r.copy()
    wrong_class[1, 5] = 3
    rec, iou, _, _ = box_agreement([r], [wrong_class])
    assert rec == 0.5 and iou == pytest.approx(0.5)
    assert box_agreement([np.zeros((0, 6))], [np.zeros((0, 6))])[:2] == (1.0, 1.0)
    assert box_agreement([np.zeros((0, 6))], [r])[:2] == (0.0, 0.0)
    # rows [1, N, 6]: low-score rows are not boxes
    ref = {"det": np.concatenate([r[None], r[None]])}
    low = r * np.array([1, 1, 1, 1, 0.1, 1])
    got = {"det": np.concatenate([r[None], low[None]])}
    c = compare(ref, got, task="detection", class_output=None, labels=None, reference_id="fp32", dataset="d")
    assert c.quality.box_recall == 0.5 and c.quality.box_iou == 0.5 and any("4 reference box(es)" in n for n in c.notes)
    assert not check_gate(c.quality, default_gate("detection"))[0]
    # decoded boxes (a package's detection decoder) take precedence over raw rows
    c = compare(ref, got, task="detection", class_output=None, labels=None, reference_id="fp32", dataset="d", ref_boxes=[r, r], got_boxes=[r, r])
    assert c.quality.box_recall == 1.0 and any("decoded" in n for n in c.notes)


def test_mask_iou() -> None:
    a = np.zeros((1, 3, 4, 4), np.float32)
    a[0, 0] = 1.0
    a[0, 1, :2, :2] = 2.0  # class 1 in the top-left quarter, class 0 elsewhere
    b = a.copy()
    b[0, 1, :2, :1] = 0.0  # half of class 1 lost to class 0
    v, how = mask_iou([a], [b])
    assert "argmax over 3 channels" in how and v == pytest.approx((12 / 14 + 2 / 4) / 2)
    p = np.zeros((1, 1, 4, 4), np.float32)
    p[0, 0, :2] = 0.9
    q = p.copy()
    q[0, 0, 0] = 0.2
    v, how = mask_iou([p], [q])
    assert "thresholded at 0.5" in how and v == pytest.approx(0.5)
    c = compare({"m": p}, {"m": q}, task="segmentation", class_output=None, labels=None, reference_id="fp32", dataset="d")
    assert c.quality.mask_iou == pytest.approx(0.5) and not check_gate(c.quality, default_gate("segmentation"))[0]


def test_default_gates_and_quality_backward_compatibility() -> None:
    assert default_gate("sequence") == {"sequence_exact_match": 0.9, "edit_distance": 0.02}
    assert set(default_gate("detection")) == {"box_recall", "box_iou"} and set(default_gate("segmentation")) == {"mask_iou"}
    assert default_gate("raw") == {"cosine": 0.99} and default_gate("classification") == {"cosine": 0.99, "top1_agreement": 0.98}
    assert parse_gate("edit_distance=0.05,mask_iou=0.8") == {"edit_distance": 0.05, "mask_iou": 0.8}
    old = Quality.from_dict({"reference": "fp32", "cosine": 0.999, "top1_agreement": 1.0, "samples": 8}, "q")
    assert old.sequence_exact_match is None and old.to_dict() == {"reference": "fp32", "cosine": 0.999, "top1_agreement": 1.0, "samples": 8}
    new = Quality.from_dict({"cosine": 0.9, "sequence_exact_match": 0.95, "edit_distance": 0.01, "box_iou": 0.8}, "q")
    assert Quality.from_dict(new.to_dict(), "q") == new
    assert "edit_distance" in Quality.MAXIMA
    g = Gate.from_dict({"passed": True, "thresholds": {"sequence_exact_match": 0.9, "edit_distance": 0.02}}, "g")
    assert dict(g.thresholds) == {"sequence_exact_match": 0.9, "edit_distance": 0.02}
    with pytest.raises(ManifestError, match="not a quality figure"):
        Gate.from_dict({"passed": True, "thresholds": {"exactness": 0.9}}, "g")


def test_a_task_gate_this_model_cannot_measure_falls_back_to_cosine(tmp_path: Path) -> None:
    """task detection on a model whose output is not box rows: the box figures cannot be measured, so the
    default gate becomes cosine, and the report says why (an explicit --gate is never replaced)."""
    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), model)
    np.save(tmp_path / "cal.npy", np.random.default_rng(1).standard_normal((8, 1, 8)).astype(np.float32))
    res = convert(model, tmp_path / "cal.npy", tmp_path / "pkg", ConvertOptions(targets=("fp16",), task="detection", progress=False))
    assert res.report["gate"] == {"cosine": 0.99} and "fp16-onnx" in res.written
    assert any("box_recall" in t and "gated on cosine" in t for t in res.report["notes"])
    forced = convert(model, tmp_path / "cal.npy", tmp_path / "pkg2", ConvertOptions(targets=("fp16",), task="detection", progress=False, gate={"box_recall": 0.9}))
    assert forced.refused == ("fp16-onnx",) and "box_recall not measured" in next(r for r in forced.report["variants"] if r["id"] == "fp16-onnx")["gate"]["failures"][0]


def test_mask_iou_finds_the_channel_axis_of_an_nhwc_one_channel_map() -> None:
    """A [1, H, W, 1] probability map (MediaPipe's selfie segmenter) under an NCHW hint is thresholded as one
    channel, not argmaxed over H: the same map scores 1.0, a shifted one less."""
    from converters.validate import mask_iou

    rng = np.random.default_rng(0)
    ref = (rng.random((1, 64, 48, 1)) > 0.5).astype(np.float32) * 0.9 + 0.05
    iou, how = mask_iou([ref], [ref.copy()], "NCHW")
    assert iou == 1.0 and how == "one channel thresholded at 0.5"
    shifted, _ = mask_iou([ref], [np.roll(ref, 5, axis=2)], "NCHW")
    assert shifted < 0.7
    multi = rng.random((1, 3, 32, 32)).astype(np.float32)  # NCHW with 3 classes stays argmax over axis 1
    assert mask_iou([multi], [multi], "NCHW") == (1.0, "argmax over 3 channels")
