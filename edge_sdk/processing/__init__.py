"""Pure functions over numpy: image preprocessing (OpenCV, checked against the NumPy reference
path in :mod:`~edge_sdk.processing.image_reference`) and output decoders (classification,
detection, segmentation). The names below are importable from here; each module loads on first
use (OpenCV only when an image is preprocessed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # for type checkers and readers: the same names, imported eagerly
    from .decoders import Classification, decode_classification, softmax
    from .detection import (
        BLAZEFACE_KEYPOINTS,
        BLAZEFACE_SHORT_RANGE_ANCHORS,
        YOLO_LAYOUTS,
        BBox,
        Detection,
        Detections,
        WeightedNMS,
        blazeface_short_range_anchors,
        box_iou,
        decode_blazeface,
        decode_yolo,
        nms,
        ssd_anchors,
        weighted_nms,
    )
    from .image import (
        MAX_IMAGE_FILE_BYTES,
        MAX_IMAGE_PIXELS,
        ImageTransform,
        decode_image_bgr,
        load_image,
        load_image_bgr,
        preprocess_image,
        read_image_file,
    )
    from .image_header import ImageHeader, probe_image
    from .image_reference import preprocess_image_reference, resize_reference
    from .segmentation import SEGMENTATION_LAYOUTS, SegmentationMask, decode_segmentation

_LAZY = {
    "BBox": "detection",
    "BLAZEFACE_KEYPOINTS": "detection",
    "BLAZEFACE_SHORT_RANGE_ANCHORS": "detection",
    "Classification": "decoders",
    "Detection": "detection",
    "Detections": "detection",
    "ImageHeader": "image_header",
    "ImageTransform": "image",
    "MAX_IMAGE_FILE_BYTES": "image",
    "MAX_IMAGE_PIXELS": "image",
    "SEGMENTATION_LAYOUTS": "segmentation",
    "SegmentationMask": "segmentation",
    "WeightedNMS": "detection",
    "YOLO_LAYOUTS": "detection",
    "blazeface_short_range_anchors": "detection",
    "box_iou": "detection",
    "decode_blazeface": "detection",
    "decode_classification": "decoders",
    "decode_segmentation": "segmentation",
    "decode_image_bgr": "image",
    "decode_yolo": "detection",
    "load_image": "image",
    "load_image_bgr": "image",
    "nms": "detection",
    "preprocess_image": "image",
    "preprocess_image_reference": "image_reference",
    "probe_image": "image_header",
    "read_image_file": "image",
    "resize_reference": "image_reference",
    "softmax": "decoders",
    "ssd_anchors": "detection",
    "weighted_nms": "detection",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
