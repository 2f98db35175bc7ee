"""The OpenCV fast path (preprocess_image) against the NumPy reference path, on real photographs
(scikit-image's), for every resize mode, colour order, layout and dtype."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from skimage import data

from edge_sdk.errors import ImageError
from edge_sdk.package import ImagePreprocess, TensorSpec
from edge_sdk.processing.image import preprocess_image
from edge_sdk.processing.image_reference import preprocess_image_reference, resize_reference

PHOTOS = {
    "astronaut_512x512": data.astronaut(),
    "coffee_400x600": data.coffee(),
    "chelsea_300x451": data.chelsea(),
    "camera_grey_512x512": data.camera(),
}


def spec(size, resize, interp, layout, dtype, color="RGB", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> TensorSpec:
    n = 1 if color == "GRAY" else 3
    shape = (1, n, *size) if layout == "NCHW" else (1, *size, n)
    pre = ImagePreprocess(size, resize=resize, color=color, mean=mean[:n], std=std[:n], interpolation=interp, pad_value=114)
    return TensorSpec("image", dtype, shape, layout, preprocess=pre)


@pytest.mark.parametrize(
    "photo,size,resize,interp",
    [(p, s, r, i) for p in PHOTOS for s, r, i in itertools.product([(224, 224), (128, 96), (300, 640)], ["stretch", "letterbox", "center_crop"], ["linear", "nearest"])],
)
def test_fast_path_equals_reference_on_photographs(photo, size, resize, interp) -> None:
    img = PHOTOS[photo]
    for layout, dtype in (("NCHW", "float32"), ("NHWC", "uint8")):
        sp = spec(size, resize, interp, layout, dtype)
        fast, _ = preprocess_image(img, sp)
        ref = preprocess_image_reference(img, sp)
        assert fast.shape == ref.shape and fast.dtype == ref.dtype, (fast.shape, ref.shape)
        if dtype == "uint8":
            diff = np.abs(fast.astype(np.int16) - ref.astype(np.int16))
            assert diff.max() <= (0 if interp == "nearest" else 1), (photo, size, resize, interp, diff.max())
            if interp == "linear":
                assert (diff > 0).mean() < 0.25  # fixed-point rounding (~12 % of pixels off by one), not a shifted grid
        else:
            step = 1 / 255 / min(sp.preprocess.std)  # one grey level after normalisation
            tol = 1e-5 if interp == "nearest" else step + 1e-5
            np.testing.assert_allclose(fast, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("color_in,model_color", [("BGR", "RGB"), ("RGB", "BGR"), ("RGB", "RGB"), ("BGR", "GRAY")])
def test_colour_orders_and_quantized_dtypes_agree(color_in, model_color) -> None:
    img = PHOTOS["coffee_400x600"]
    if color_in == "BGR":
        img = np.ascontiguousarray(img[:, :, ::-1])
    for dtype in ("int8", "uint8", "float16"):
        sp = spec((96, 128), "letterbox", "nearest", "NHWC", dtype, color=model_color)
        fast, _ = preprocess_image(img, sp, color=color_in)
        ref = preprocess_image_reference(img, sp, color=color_in)
        tol = 1 if model_color == "GRAY" else 0  # cv2's fixed-point luma vs BT.601 in float
        if dtype == "float16":
            np.testing.assert_allclose(fast.astype(np.float32), ref.astype(np.float32), atol=0.02 + tol * 0.02)
        else:
            assert np.abs(fast.astype(np.int16) - ref.astype(np.int16)).max() <= tol


def test_grey_photo_to_a_3_channel_model() -> None:
    sp = spec((64, 64), "stretch", "linear", "NCHW", "float32")
    fast, _ = preprocess_image(PHOTOS["camera_grey_512x512"], sp)
    ref = preprocess_image_reference(PHOTOS["camera_grey_512x512"], sp)
    np.testing.assert_allclose(fast, ref, atol=1 / 255 / 0.224 + 1e-5)


def test_the_reference_resize_is_opencvs_convention_not_a_look_alike() -> None:
    # 4 -> 2 linear: half-pixel centres average pixel pairs; nearest takes floor(x * 2)
    row = np.array([[[0], [100], [200], [250]]], np.uint8)
    assert resize_reference(row, (2, 1), "linear")[0, :, 0].tolist() == [50, 225]
    assert resize_reference(row, (2, 1), "nearest")[0, :, 0].tolist() == [0, 200]
    # 2 -> 4 linear: edges clamp, inner pixels interpolate at 1/4 and 3/4
    up = resize_reference(np.array([[[0], [100]]], np.uint8), (4, 1), "linear")[0, :, 0].tolist()
    assert up == [0, 25, 75, 100]
    with pytest.raises(ImageError, match="'linear' and 'nearest'"):
        resize_reference(row, (2, 1), "cubic")


@pytest.mark.parametrize("photo,size,resize", [(p, s, r) for p in PHOTOS for s, r in itertools.product([(128, 128), (96, 128), (300, 640)], ["stretch", "letterbox", "center_crop"])])
def test_top_left_grid_equals_reference_on_photographs(photo, size, resize) -> None:
    """sampling_grid="top_left" (MediaPipe's and TF1's grid): the warpAffine fast path against the
    reference, and a real shift against the default grid (half a model pixel, not a look-alike)."""
    img = PHOTOS[photo]
    n = 1 if img.ndim == 2 else 3
    pre = ImagePreprocess(size, resize=resize, mean=(0.5,) * n, std=(0.5,) * n, pad_value=0, sampling_grid="top_left", color="GRAY" if n == 1 else "RGB")
    sp = TensorSpec("image", "uint8", (1, *size, n), "NHWC", preprocess=pre)
    fast, tf = preprocess_image(img, sp)
    ref = preprocess_image_reference(img, sp)
    assert fast.shape == ref.shape
    diff = np.abs(fast.astype(np.int16) - ref.astype(np.int16))
    # OpenCV's fixed-point coordinates land on a neighbouring 1/32 pixel now and then: a few grey levels at
    # a steep edge, on a few pixels in a thousand; most differ by the weights' rounding alone
    assert diff.max() <= 8 and (diff > 1).mean() < 0.005 and (diff > 0).mean() < 0.25, (diff.max(), (diff > 1).mean(), (diff > 0).mean())
    centers = TensorSpec("image", "uint8", (1, *size, n), "NHWC", preprocess=ImagePreprocess(size, resize=resize, mean=pre.mean, std=pre.std, pad_value=0, color=pre.color))
    other, tf_c = preprocess_image(img, centers)
    assert (tf.scale_xy, tf.pad_xy) == (tf_c.scale_xy, tf_c.pad_xy)  # same geometry: only where pixels are sampled differs
    shifted = np.abs(other.astype(np.int16) - fast.astype(np.int16))
    if tf.scale_xy == (1.0, 1.0):  # no resize (a 300-pixel-high photo letterboxed to 300 high): both grids are the pixels
        assert shifted.max() == 0
    else:
        assert shifted.max() > 8 and shifted.mean() > 4 * diff.mean(), (shifted.mean(), diff.mean())


def test_top_left_grid_samples_at_k_over_scale() -> None:
    # 8 -> 2 (scale 1/4): output pixel k samples source 4k exactly (top_left), not 4k + 1.5 (centres)
    row = np.array([[[0], [10], [20], [30], [40], [50], [60], [70]]], np.uint8)
    pre = ImagePreprocess((1, 2), resize="stretch", color="GRAY", mean=(0.0,), std=(1.0,), sampling_grid="top_left")
    sp = TensorSpec("image", "uint8", (1, 1, 2, 1), "NHWC", preprocess=pre)
    assert preprocess_image(row, sp)[0][0, 0, :, 0].tolist() == [0, 40] == preprocess_image_reference(row, sp)[0, 0, :, 0].tolist()


def test_top_left_grid_is_linear_only_and_written_only_when_set() -> None:
    from edge_sdk.errors import ManifestError

    base = {"kind": "image", "size_hw": [8, 8]}
    assert ImagePreprocess.from_dict(base, "x").sampling_grid == "centers"
    assert "sampling_grid" not in ImagePreprocess.from_dict(base, "x").to_dict()  # a package without it stays readable by older SDKs
    tl = ImagePreprocess.from_dict({**base, "sampling_grid": "top_left"}, "x")
    assert tl.to_dict()["sampling_grid"] == "top_left" and ImagePreprocess.from_dict(tl.to_dict(), "x") == tl
    with pytest.raises(ManifestError, match="x.sampling_grid: 'top_left' samples with interpolation 'linear' only, got interpolation 'area'"):
        ImagePreprocess.from_dict({**base, "sampling_grid": "top_left", "interpolation": "area"}, "x")
    with pytest.raises(ManifestError, match="x.sampling_grid"):
        ImagePreprocess.from_dict({**base, "sampling_grid": "corners"}, "x")
    sp = TensorSpec("image", "uint8", (1, 8, 8, 3), "NHWC", preprocess=ImagePreprocess((8, 8), interpolation="cubic", sampling_grid="top_left"))
    with pytest.raises(ImageError, match="'linear' only"):
        preprocess_image(np.zeros((16, 16, 3), np.uint8), sp)


def test_the_converter_and_pull_carry_the_grid() -> None:
    """``edge-convert --preprocess ...,sampling_grid=top_left`` and the ``--preprocess`` argument
    ``edge-sdk pull --quantize`` builds from a catalog manifest keep the grid (the catalog's BlazeFace sets it)."""
    from converters.cli import _parse_preprocess
    from edge_sdk.store.catalog import load_catalog
    from edge_sdk.store.recipes import _preprocess_arg

    pre = _parse_preprocess("size=128x128,resize=letterbox,mean=0.5:0.5:0.5,std=0.5:0.5:0.5,pad_value=0,sampling_grid=top_left")
    assert pre.sampling_grid == "top_left" and pre.pad_value == 0
    face = load_catalog()["mediapipe-face-detection-short-range"].manifest
    assert face is not None
    table = face["inputs"][0]["preprocess"]
    assert table["sampling_grid"] == "top_left"
    assert _parse_preprocess(_preprocess_arg(table)) == ImagePreprocess.from_dict(table, "catalog")
    with pytest.raises(SystemExit, match="sampling_grid"):
        _parse_preprocess("size=8x8,grid=top_left")


@pytest.mark.parametrize(
    "src_hw,size,resize,channels",
    [
        ((480, 640), (128, 128), "letterbox", 3),  # the face clip: 5x, 96 rows padded top and bottom
        ((720, 1280), (128, 128), "letterbox", 3),  # 10x
        ((1080, 1920), (128, 128), "letterbox", 1),  # 15x, grey
        ((256, 256), (128, 128), "stretch", 3),  # 2x, no padding
        ((96, 128), (128, 128), "letterbox", 3),  # 1x: the pixels themselves
        ((8, 8), (1, 2), "stretch", 1),  # 8x vertically, 4x across
        ((500, 640), (128, 128), "letterbox", 3),  # 640 is 5 x 128 but 500 rows are not 5 x 100: warpAffine
        ((480, 600), (128, 128), "letterbox", 3),  # not a whole multiple: warpAffine
    ],
)
def test_top_left_whole_pixel_grid_is_warp_affines_bytes(src_hw, size, resize, channels) -> None:
    """Where the top_left grid falls on whole source pixels, preprocessing reads them with a nearest
    remap instead of warpAffine: the same bytes, on noise (where a neighbouring pixel or a 1/32
    pixel shift would show) as on a photograph; other sizes still take warpAffine."""
    import cv2

    from edge_sdk.processing.image import _geometry, _integer_grid, _sample_top_left

    rng = np.random.default_rng(sum(src_hw) + channels)
    shape = (*src_hw, channels) if channels == 3 else src_hw
    pre = ImagePreprocess(size, resize=resize, mean=(0.5,) * channels, std=(0.5,) * channels, pad_value=7, sampling_grid="top_left", color="GRAY" if channels == 1 else "RGB")
    src_h, src_w = src_hw
    nh, nw, py, px = _geometry(pre, src_h, src_w)
    whole = src_h % nh == 0 and src_w % nw == 0
    assert (_integer_grid(src_h, src_w, nh, nw) is not None) == whole
    photo = cv2.resize(PHOTOS["astronaut_512x512"], (src_w, src_h), interpolation=cv2.INTER_AREA)
    if channels == 1:
        photo = cv2.cvtColor(photo, cv2.COLOR_RGB2GRAY)
    for img in (rng.integers(0, 256, shape, dtype=np.uint8), photo):
        m = np.array([[nw / src_w, 0.0, px], [0.0, nh / src_h, py]], np.float64)
        want = cv2.warpAffine(img, m, size[::-1], flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=(7,) * 4)
        got = _sample_top_left(img, nh, nw, py, px, *size, 7)
        assert np.array_equal(got.reshape(want.shape), want)
        if whole:  # the picks themselves: every kx-th column of every ky-th row, padding around them
            ky, kx = src_h // nh, src_w // nw
            assert np.array_equal(got[py : py + nh, px : px + nw].reshape(img[::ky, ::kx].shape), img[::ky, ::kx])
            assert (got[:py] == 7).all() and (got[py + nh :] == 7).all()
        sp = TensorSpec("image", "uint8", (1, *size, channels), "NHWC", preprocess=pre)
        assert np.array_equal(preprocess_image(img, sp)[0][0], got.reshape(size[0], size[1], channels))
