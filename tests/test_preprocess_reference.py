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
