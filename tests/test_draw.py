"""edge_sdk.processing.draw: boxes at the right pixels, the input untouched, masks blended over
their own pixels only, keypoints, the classification text box, scaling to another image size,
typed errors; Result.draw / Result.plot and FrameResult.draw on a real model and pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

import edge_sdk  # noqa: E402
from edge_sdk.errors import ImageError, OptionsError, OptionsTypeError  # noqa: E402
from edge_sdk.model import Result, Timings  # noqa: E402
from edge_sdk.processing.decoders import Classification  # noqa: E402
from edge_sdk.processing.detection import Detections  # noqa: E402
from edge_sdk.processing.draw import class_color, draw  # noqa: E402
from edge_sdk.processing.image import ImageTransform  # noqa: E402
from edge_sdk.processing.segmentation import SegmentationMask  # noqa: E402

BOX = (20, 30, 80, 90)  # x1, y1, x2, y2


def _dets(boxes=(BOX,), scores=(0.9,), ids=(0,), keypoints=None) -> Detections:
    kp = None if keypoints is None else np.asarray(keypoints, np.float32)
    return Detections(np.asarray(boxes, np.float32), np.asarray(scores, np.float32), np.asarray(ids), None, kp)


def _result(decoded, source_hw=None) -> Result:
    tf = None if source_hw is None else ImageTransform(source_hw, (1.0, 1.0), (0.0, 0.0))
    return Result({}, decoded, Timings(0, 0, 0, 0, 0), "v", "onnxruntime", "m", "1", "0" * 64, transform=tf)


def _changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a != b).any(axis=2)


def test_a_one_pixel_box_is_drawn_exactly_on_its_edges() -> None:
    img = np.zeros((120, 160, 3), np.uint8)
    out = draw(img, _dets(), line_width=1, labels=False, scores=False)
    col = np.array(class_color(0), np.uint8)
    x1, y1, x2, y2 = BOX
    for y, x in ((60, x1), (60, x2), (y1, 50), (y2, 50), (y1, x1), (y2, x2)):  # on the edges
        assert (out[y, x] == col).all(), (y, x, out[y, x])
    for y, x in ((60, x1 + 1), (60, x2 - 1), (y1 + 1, 50), (y2 - 1, 50), (60, 50)):  # just inside
        assert (out[y, x] == 0).all(), (y, x)
    for y, x in ((60, x1 - 1), (60, x2 + 1), (y1 - 1, 50), (y2 + 1, 50)):  # just outside
        assert (out[y, x] == 0).all(), (y, x)
    # exactly the perimeter changed: 2 * (61 + 61) - 4 pixels
    assert int(_changed(out, img).sum()) == 2 * ((x2 - x1 + 1) + (y2 - y1 + 1)) - 4


def test_a_thick_box_straddles_its_edges_and_a_label_sits_above_it() -> None:
    img = np.full((240, 320, 3), 255, np.uint8)
    x1, y1, x2, y2 = 20, 80, 80, 140
    out = draw(img, _dets(boxes=((x1, y1, x2, y2),)), line_width=3, labels=True, scores=True)
    col = np.array(class_color(0), np.uint8)
    assert (out[110, x1 - 1 : x1 + 2] == col).all()  # centred on the edge (OpenCV widens thick lines a little)
    assert (out[110, x1 + 3 : x2 - 3] == 255).all() and (out[110, : x1 - 3] == 255).all()
    label_band = _changed(out[: y1 - 2, x1:], img[: y1 - 2, x1:])  # rows above the box: the label box
    assert label_band.sum() > 100 and not _changed(out[: y1 - 50], img[: y1 - 50]).any()
    assert not _changed(out[y2 + 3 :], img[y2 + 3 :]).any()  # nothing below the box
    top = draw(img, _dets(), line_width=3)  # no room above a box at y=30: the label goes inside, under its top edge
    assert _changed(top[BOX[1] + 3 : BOX[1] + 12, BOX[0] + 3 : BOX[0] + 30], img[BOX[1] + 3 : BOX[1] + 12, BOX[0] + 3 : BOX[0] + 30]).any()


def test_the_input_is_never_modified_and_the_output_is_a_new_array() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
    before = img.copy()
    seg = SegmentationMask(np.ones((64, 96), np.uint8), ("background", "person"))
    cls = ((Classification(0, "cat", 0.9), Classification(1, "dog", 0.1)),)
    for decoded in (_dets(keypoints=[[[50, 60], [40, 40]]]), seg, cls, None):
        out = draw(img, _result(decoded))
        assert out.dtype == np.uint8 and out.shape == img.shape and out.flags.c_contiguous
        assert not np.shares_memory(out, img)
        np.testing.assert_array_equal(img, before)
    ro = img.copy()
    ro.flags.writeable = False  # a frame from a source is read-only: drawing still works
    assert _changed(draw(ro, _dets()), ro).any()


def test_conf_leaves_low_scoring_detections_out() -> None:
    img = np.zeros((120, 160, 3), np.uint8)
    d = _dets(boxes=(BOX, (100, 10, 150, 50)), scores=(0.9, 0.3), ids=(0, 1))
    out = draw(img, d, conf=0.5, labels=False, scores=False, line_width=1)
    assert (out[60, BOX[0]] == class_color(0)).all()
    assert not _changed(out[:, 95:], img[:, 95:]).any()  # the 0.3 box is not drawn
    both = draw(img, d, labels=False, scores=False, line_width=1)
    assert (both[30, 100] == class_color(1)).all()


def test_keypoints_are_drawn_in_the_detections_colour_and_can_be_turned_off() -> None:
    img = np.zeros((120, 160, 3), np.uint8)
    d = _dets(keypoints=[[[50, 60], [35, 45]]])
    out = draw(img, d, labels=False, scores=False, line_width=1)
    for x, y in ((50, 60), (35, 45)):
        assert (out[y, x] == class_color(0)).all()
        assert (out[y, x + 3] == 255).all()  # the white ring around the dot (radius 2, ring 3)
    off = draw(img, d, labels=False, scores=False, keypoints=False, line_width=1)
    assert (off[60, 50] == 0).all() and (off[45, 35] == 0).all()


def test_boxes_are_scaled_when_the_image_is_not_the_source_size() -> None:
    """A result in 240x320 source pixels drawn on a 120x160 thumbnail: every coordinate halves."""
    small = np.zeros((120, 160, 3), np.uint8)
    r = _result(_dets(boxes=((40, 60, 160, 180),), keypoints=[[[100, 120]]]), source_hw=(240, 320))
    out = r.draw(small, labels=False, scores=False, line_width=1)
    col = class_color(0)
    assert (out[60, 20] == col).all() and (out[60, 80] == col).all() and (out[30, 50] == col).all() and (out[90, 50] == col).all()
    assert (out[60, 50] == col).all()  # the keypoint at (100, 120) -> (50, 60)
    assert not _changed(out[95:], small[95:]).any()


def test_a_mask_blends_only_its_own_pixels() -> None:
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    cm = np.zeros((60, 80), np.uint8)
    cm[10:30, 20:50] = 1
    cm[40:55, 5:15] = 2
    seg = SegmentationMask(cm, ("background", "person", "cat"))
    out = draw(img, seg, labels=False, mask_alpha=0.5)
    changed = _changed(out, img)
    assert not changed[cm == 0].any()  # the background class is not painted, nor anything else
    for c in (1, 2):
        want = np.clip(img[cm == c].astype(np.float32) * 0.5 + np.array(class_color(c), np.float32) * 0.5 + 0.5, 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(out[cm == c], want)
    assert changed[cm > 0].mean() > 0.95  # a pixel already at the blend would not change: almost none
    legend = draw(img, seg, labels=True)
    assert _changed(legend[:20, :40], img[:20, :40]).any()  # the legend names the painted classes
    unmasked = draw(img, seg, masks=False)
    np.testing.assert_array_equal(unmasked, img)


def test_a_model_size_mask_is_resized_to_the_image() -> None:
    img = np.zeros((64, 64, 3), np.uint8)
    cm = np.zeros((16, 16), np.uint8)
    cm[:, 8:] = 1  # the right half
    out = draw(img, SegmentationMask(cm, ("background", "thing")), labels=False)
    changed = _changed(out, img)
    assert changed[:, 32:].all() and not changed[:, :32].any()


def test_classification_draws_the_top_classes_in_a_text_box() -> None:
    img = np.full((200, 300, 3), 255, np.uint8)
    rows = ((Classification(2, "triangle", 0.8), Classification(0, "circle", 0.15), Classification(1, "square", 0.05)),)
    out = draw(img, _result(rows))
    changed = _changed(out, img)
    assert changed[:10, :10].all()  # the dark box starts at the corner
    assert not changed[100:, 150:].any()
    box_rows = np.flatnonzero(changed.any(axis=1))
    fewer = _changed(draw(img, _result(rows), conf=0.5), img)
    assert np.flatnonzero(fewer.any(axis=1)).max() < box_rows.max()  # one line instead of three


def test_rgb_and_grey_inputs_come_back_as_bgr() -> None:
    red_rgb = np.zeros((20, 20, 3), np.uint8)
    red_rgb[..., 0] = 255
    out = draw(red_rgb, None, color="RGB")
    assert (out[10, 10] == (0, 0, 255)).all()
    grey = np.full((20, 20), 77, np.uint8)
    assert (draw(grey, None, color="GRAY") == 77).all() and draw(grey, None, color="GRAY").shape == (20, 20, 3)


def test_bad_input_gets_typed_errors() -> None:
    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ImageError, match="dtype uint8"):
        draw(img.astype(np.float32), None)
    with pytest.raises(ImageError, match="BGRA"):
        draw(np.zeros((8, 8, 4), np.uint8), None)
    with pytest.raises(ImageError, match="does not fit"):
        draw(img, None, color="GRAY")
    with pytest.raises(OptionsError, match="conf"):
        draw(img, None, conf=1.5)
    with pytest.raises(OptionsError, match="color"):
        draw(img, None, color="HSV")
    with pytest.raises(OptionsTypeError, match="Result"):
        draw(img, object())


def test_class_colours_are_fixed_and_distinct() -> None:
    colours = [class_color(i) for i in range(24)]
    assert len(set(colours)) == 24
    assert colours == [class_color(i) for i in range(24)]
    assert all(c not in ((0, 0, 0), (255, 255, 255)) for c in colours)


def test_result_plot_on_a_real_model(demo_package: Path) -> None:
    from edge_sdk.assets import demo_samples

    sample = demo_samples()[0]
    with edge_sdk.load(demo_package, "generic-x86_64") as m:
        r = m.predict_image(sample)
        from_path = r.plot(sample)
        img = cv2.imread(str(sample))
        assert from_path.shape == img.shape and _changed(from_path, img).any()
        np.testing.assert_array_equal(from_path, r.draw(img))
        canvas = r.plot()  # no image: a black canvas of the source size
        assert canvas.shape == img.shape and canvas.any()
        tensor_result = m.predict(m.prepare_image(sample).feeds)
        with pytest.raises(ImageError, match="pass image="):
            tensor_result.plot()


def test_frame_result_draw_in_a_pipeline(demo_package: Path) -> None:
    from edge_sdk.assets import demo_samples
    from edge_sdk.pipelines import VisionPipeline

    drawn: list[tuple[np.ndarray, np.ndarray]] = []
    with edge_sdk.load(demo_package, "generic-x86_64") as m:
        VisionPipeline(m, demo_samples()[0].parent, sinks=[lambda fr: drawn.append((fr.frame.image.copy(), fr.draw()))]).run()
    assert len(drawn) == len(demo_samples())
    for frame, out in drawn:
        assert out.shape == frame.shape and _changed(out[:8, :8], frame[:8, :8]).any()
