"""The manifest schema: ``edge-model.toml`` parsed and checked into frozen dataclasses.

:meth:`Manifest.from_dict` checks every field (types, allowed values, unknown
keys) and every rule that spans fields, and raises
:class:`~edge_sdk.errors.ManifestError` naming the field; ``to_dict`` /
``to_toml`` write the same form back. Nothing here touches the file system.
"""

from __future__ import annotations

import math
from dataclasses import field
from pathlib import PurePosixPath
from typing import Any, Iterable, Mapping

from .. import _toml
from .._record import frozen
from ..errors import ManifestError, UnsafePackageError
from ..profiles import BACKENDS, PRECISIONS

MANIFEST_NAME = "edge-model.toml"
SCHEMA_VERSION = 1

DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32", "int64", "bool")
BACKEND_FORMATS = {"onnxruntime": "onnx", "litert": "tflite"}
LAYOUTS = ("NCHW", "NHWC", "NC", "NLC", "NCL")
RESIZE_MODES = ("stretch", "letterbox", "center_crop")
INTERPOLATIONS = ("linear", "area", "nearest", "cubic")
SAMPLING_GRIDS = ("centers", "top_left")
COLOR_ORDERS = ("RGB", "BGR", "GRAY")
DECODERS = ("raw", "classification", "detection", "segmentation")
# Extra [decoder] keys each kind accepts (checked: a typo is an error, not a silent default).
DECODER_PARAMS: dict[str, dict[str, tuple[type, ...]]] = {
    "raw": {},
    "classification": {},
    "detection": {
        "format": (str,), "outputs": (list,), "score_threshold": (int, float), "iou_threshold": (int, float),
        "nms": (str,), "max_detections": (int,), "clip": (bool,), "anchors": (dict,), "layout": (str,),
        "class_aware": (bool,), "normalized": (bool,), "apply_sigmoid": (bool,),
    },
    "segmentation": {"layout": (str,), "activation": (str,), "threshold": (int, float), "upsample": (str,), "keep_probabilities": (bool,)},
}  # fmt: skip
DETECTION_FORMATS = ("blazeface", "yolo")
TASKS = ("classification", "detection", "segmentation", "embedding", "audio", "raw", "text-generation", "sequence")
KV_DTYPES = ("float32", "float16")
ARCHITECTURES = ("llama", "qwen2")

# Sane maxima for every size and count a manifest declares (nothing real comes near them). Each is
# checked when the manifest is parsed, before any of it is used, and a value past one is a
# ManifestError naming the field and the bound. What a device can afford is checked later, against
# its profile's memory budget (edge_sdk.selection).
MAX_RANK = 16  #: axes of one tensor
MAX_DIM = 1 << 24  #: a fixed dim, or either bound of a dynamic one
MAX_TENSOR_ELEMENTS = 1 << 31  #: elements of one tensor at its largest declared shape
MAX_IMAGE_SIDE = 16384  #: preprocess.size_hw, each side (pixels)
MAX_IMAGE_PIXELS = 1 << 26  #: preprocess.size_hw, height x width (64 Mpx)
MAX_FILE_BYTES = 1 << 40  #: a model file, an external data file, and a variant's total (1 TiB)
MAX_TEXT_FILE_BYTES = 1 << 28  #: tokenizer, chat template, reference stats (read into memory whole)
MAX_TENSORS = 1024  #: inputs or outputs of one list
MAX_VARIANTS = 256
MAX_EXTERNAL_FILES = 4096  #: external data files of one variant
MAX_LABELS = 1 << 20
MAX_LIST_ITEMS = 4096  #: state pairs, benchmarks, eos token ids, decoder outputs
MAX_BATCH = 1 << 16  #: benchmark batch
MAX_THREADS = 4096  #: benchmark / bench threads
MAX_TOP_K = 1 << 16  #: decoder.top_k, decoder.max_detections
MAX_TOKENS = 1 << 24  #: context length, vocabulary size, prompt tokens
MAX_LAYERS = 4096  #: layers, heads, head_dim of a generation spec
MAX_KV_BYTES_PER_TOKEN = 1 << 30


def _bounded(v: int, hi: int, where: str, what: str = "") -> int:
    """``v`` if it is at most ``hi``; else a ManifestError naming ``where`` and the bound."""
    if v > hi:
        raise ManifestError(f"{where}: {v} is over the limit of {hi}{f' ({what})' if what else ''}")
    return v


def _items(v: list[Any], hi: int, where: str) -> list[Any]:
    """A declared list with at most ``hi`` items; else a ManifestError naming ``where`` and the bound."""
    if len(v) > hi:
        raise ManifestError(f"{where}: {len(v)} items, over the limit of {hi}")
    return v


def _req(d: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ManifestError(f"{where}: missing required key '{key}'")
    return _typed(d[key], typ, f"{where}.{key}")


def _opt(d: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    if key not in d:
        return default
    return _typed(d[key], typ, f"{where}.{key}")


def _typed(v: Any, typ: type | tuple[type, ...], where: str) -> Any:
    # bool is an int subclass: never accept it where a number is expected
    if isinstance(v, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise ManifestError(f"{where}: expected {_tname(typ)}, got bool {v!r}")
    if not isinstance(v, typ):
        raise ManifestError(f"{where}: expected {_tname(typ)}, got {type(v).__name__} {v!r}")
    return v


def _tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _no_unknown(d: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise ManifestError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}")


def _choice(v: str, choices: Iterable[str], where: str) -> str:
    choices = tuple(choices)
    if v not in choices:
        raise ManifestError(f"{where}: expected one of {list(choices)}, got {v!r}")
    return v


def _hex64(v: str, where: str) -> str:
    if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise ManifestError(f"{where}: expected 64 lower-case hex digits (sha256), got {v!r}")
    return v


@frozen
class ImagePreprocess:
    """How an image becomes this input tensor.

    ``size_hw`` is the model's (height, width) in pixels. ``color`` is the
    channel order the model wants. ``interpolation``: the resize kernel —
    "linear" (default; ~14x faster than "area" for a 640x480 -> 224 frame),
    "area" (what a model trained on area-downscaled images expects), "nearest",
    "cubic". Float inputs get ``x * scale``, then
    ``(x - mean) / std`` per channel; uint8 inputs get the resized pixels as
    they are; int8 inputs get ``pixel - 128``.

    ``sampling_grid``: where output pixel ``k`` samples the source, for a model
    whose accuracy depends on it. "centers" (default): pixel centres align,
    source ``(k + 0.5) / scale - 0.5`` (OpenCV's resize, PIL, PyTorch with
    ``align_corners=False``, TF2's ``half_pixel_centers=True``). "top_left":
    source ``k / scale`` (TF1's ``resize_bilinear``, and MediaPipe's
    ImageToTensorCalculator, which warps the ROI's corners onto the tensor's;
    MediaPipe's own models expect it: BlazeFace's boxes lie half a model pixel
    off with "centers"); "linear" only, the padding blended in at the border as
    MediaPipe does.
    """

    size_hw: tuple[int, int]
    resize: str = "stretch"
    color: str = "RGB"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    pad_value: int = 114
    crop_fraction: float = 0.875
    interpolation: str = "linear"
    sampling_grid: str = "centers"

    @property
    def channels(self) -> int:
        """1 for GRAY, else 3."""
        return 1 if self.color == "GRAY" else 3

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "ImagePreprocess":
        """Parse an input's ``preprocess`` table; :class:`~edge_sdk.errors.ManifestError` (naming ``where``) for an unknown key or a bad
        value."""
        _no_unknown(d, ("kind", "size_hw", "resize", "color", "scale", "mean", "std", "pad_value", "crop_fraction", "interpolation", "sampling_grid"), where)
        kind = _req(d, "kind", str, where)
        _choice(kind, ("image",), f"{where}.kind")
        size = _req(d, "size_hw", list, where)
        if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size):
            raise ManifestError(f"{where}.size_hw: expected [height, width] positive ints, got {size!r}")
        for axis, side in zip(("height", "width"), size):
            _bounded(side, MAX_IMAGE_SIDE, f"{where}.size_hw", f"MAX_IMAGE_SIDE pixels of {axis}")
        _bounded(size[0] * size[1], MAX_IMAGE_PIXELS, f"{where}.size_hw", f"MAX_IMAGE_PIXELS, height x width of {size}")
        color = _choice(_opt(d, "color", str, where, "RGB"), COLOR_ORDERS, f"{where}.color")
        n = 1 if color == "GRAY" else 3
        mean = tuple(float(_typed(x, (int, float), f"{where}.mean")) for x in _opt(d, "mean", list, where, [0.0] * n))
        std = tuple(float(_typed(x, (int, float), f"{where}.std")) for x in _opt(d, "std", list, where, [1.0] * n))
        if len(mean) != n or len(std) != n:
            raise ManifestError(f"{where}: mean/std need {n} values for color {color}, got {len(mean)}/{len(std)}")
        if any(s == 0 for s in std):
            raise ManifestError(f"{where}.std: values must be non-zero, got {list(std)}")
        scale = float(_opt(d, "scale", (int, float), where, 1.0 / 255.0))
        if not all(math.isfinite(v) for v in (*mean, *std, scale)):
            raise ManifestError(f"{where}: mean, std and scale must be finite, got mean={list(mean)} std={list(std)} scale={scale}")
        crop = float(_opt(d, "crop_fraction", (int, float), where, 0.875))
        if not 0 < crop <= 1:
            raise ManifestError(f"{where}.crop_fraction: expected 0 < f <= 1, got {crop}")
        pad = _opt(d, "pad_value", int, where, 114)
        if not 0 <= pad <= 255:
            raise ManifestError(f"{where}.pad_value: expected 0..255, got {pad}")
        interpolation = _choice(_opt(d, "interpolation", str, where, "linear"), INTERPOLATIONS, f"{where}.interpolation")
        grid = _choice(_opt(d, "sampling_grid", str, where, "centers"), SAMPLING_GRIDS, f"{where}.sampling_grid")
        if grid == "top_left" and interpolation != "linear":
            raise ManifestError(f"{where}.sampling_grid: 'top_left' samples with interpolation 'linear' only, got interpolation {interpolation!r}")
        return cls(
            size_hw=(size[0], size[1]),
            resize=_choice(_opt(d, "resize", str, where, "stretch"), RESIZE_MODES, f"{where}.resize"),
            color=color,
            scale=scale,
            mean=mean,
            std=std,
            pad_value=pad,
            crop_fraction=crop,
            interpolation=interpolation,
            sampling_grid=grid,
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        return {
            "kind": "image",
            "size_hw": list(self.size_hw),
            "resize": self.resize,
            "color": self.color,
            "scale": self.scale,
            "mean": list(self.mean),
            "std": list(self.std),
            "pad_value": self.pad_value,
            "crop_fraction": self.crop_fraction,
            "interpolation": self.interpolation,
            # written only when not the default, so that a package that does not use it stays readable by SDKs before it
            **({"sampling_grid": self.sampling_grid} if self.sampling_grid != "centers" else {}),
        }


Dim = int | str
_DTYPE_BYTES = {"float32": 4, "float16": 2, "float64": 8, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "bool": 1}


@frozen
class TensorSpec:
    """A declared model input or output.

    ``shape`` holds ints for fixed dims and names for dynamic ones; every
    dynamic dim of an *input* must have inclusive bounds in ``dim_bounds``
    (name -> (min, max)).
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    layout: str | None = None
    dim_bounds: tuple[tuple[str, int, int], ...] = ()
    preprocess: ImagePreprocess | None = None

    def bounds(self, dim: str) -> tuple[int, int] | None:
        """The inclusive (min, max) bounds of dynamic dim ``dim``, or None if it has none."""
        for n, lo, hi in self.dim_bounds:
            if n == dim:
                return lo, hi
        return None

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def _shape_at(self, end: int) -> tuple[int, ...]:
        """Fixed dims as they are, dynamic ones at their lower (``end`` 0) or upper (1) bound; 1 without bounds."""
        out = []
        for d in self.shape:
            if isinstance(d, int):
                out.append(d)
            else:
                b = self.bounds(d)
                out.append(b[end] if b else 1)
        return tuple(out)

    def max_shape(self) -> tuple[int, ...]:
        """The largest concrete shape this spec admits (dynamic dims at their maximum; 1 without bounds)."""
        return self._shape_at(1)

    def nbytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of this tensor at ``shape`` (``min_shape()`` or ``max_shape()``)."""
        return math.prod(shape) * _DTYPE_BYTES.get(self.dtype, 8)

    def min_shape(self) -> tuple[int, ...]:
        """The smallest concrete shape this spec admits (dynamic dims at their minimum)."""
        return self._shape_at(0)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str, *, is_input: bool) -> "TensorSpec":
        """Parse one ``inputs``/``outputs`` entry; :class:`~edge_sdk.errors.ManifestError` (naming ``where`` and the tensor) for a bad
        dtype, shape, layout or dims, or an input dynamic dim without bounds."""
        _no_unknown(d, ("name", "dtype", "shape", "layout", "dims", "preprocess"), where)
        name = _req(d, "name", str, where)
        where = f"{where}[{name}]"
        dtype = _choice(_req(d, "dtype", str, where), DTYPES, f"{where}.dtype")
        raw_shape = _items(_req(d, "shape", list, where), MAX_RANK, f"{where}.shape")
        shape: list[Dim] = []
        for i, s in enumerate(raw_shape):
            if isinstance(s, bool) or not isinstance(s, (int, str)):
                raise ManifestError(f"{where}.shape[{i}]: expected int or dim name, got {s!r}")
            if isinstance(s, int) and s <= 0:
                raise ManifestError(f"{where}.shape[{i}]: fixed dims must be > 0, got {s}")
            if isinstance(s, int):
                _bounded(s, MAX_DIM, f"{where}.shape[{i}]", "MAX_DIM")
            shape.append(s)
        bounds_d = _opt(d, "dims", dict, where, {})
        bounds: list[tuple[str, int, int]] = []
        for dn, b in bounds_d.items():
            if dn not in shape:
                raise ManifestError(f"{where}.dims.{dn}: not a dynamic dim of shape {raw_shape}")
            if not (isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in b)):
                raise ManifestError(f"{where}.dims.{dn}: expected [min, max] ints, got {b!r}")
            if not 1 <= b[0] <= b[1]:
                raise ManifestError(f"{where}.dims.{dn}: expected 1 <= min <= max, got {b}")
            _bounded(b[1], MAX_DIM, f"{where}.dims.{dn}", "MAX_DIM")
            bounds.append((dn, b[0], b[1]))
        if is_input:
            unbounded = [s for s in shape if isinstance(s, str) and s not in bounds_d]
            if unbounded:
                raise ManifestError(
                    f"{where}: dynamic dim(s) {unbounded} need bounds under 'dims' (e.g. dims = {{ {unbounded[0]} = [1, 8] }})"
                )
        layout = _opt(d, "layout", str, where)
        if layout is not None:
            _choice(layout, LAYOUTS, f"{where}.layout")
            if len(layout) != len(shape):
                raise ManifestError(f"{where}.layout: {layout} has {len(layout)} axes, shape has {len(shape)}")
        pre = None
        if "preprocess" in d:
            if not is_input:
                raise ManifestError(f"{where}.preprocess: only inputs can declare preprocessing")
            pre = ImagePreprocess.from_dict(_typed(d["preprocess"], dict, f"{where}.preprocess"), f"{where}.preprocess")
            if layout not in ("NCHW", "NHWC"):
                raise ManifestError(f"{where}: image preprocessing needs layout NCHW or NHWC, got {layout!r}")
            h_ax, w_ax, c_ax = (2, 3, 1) if layout == "NCHW" else (1, 2, 3)
            want = (pre.size_hw[0], pre.size_hw[1], pre.channels)
            got = (shape[h_ax], shape[w_ax], shape[c_ax])
            if got != want:
                raise ManifestError(f"{where}: preprocess size_hw/color give (H, W, C) = {want}, shape {raw_shape} has {got}")
        spec = cls(name=name, dtype=dtype, shape=tuple(shape), layout=layout, dim_bounds=tuple(bounds), preprocess=pre)
        _bounded(
            math.prod(spec.max_shape()),
            MAX_TENSOR_ELEMENTS,
            f"{where}.shape",
            f"MAX_TENSOR_ELEMENTS at the largest declared shape {list(spec.max_shape())}",
        )
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        d: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.layout:
            d["layout"] = self.layout
        if self.dim_bounds:
            d["dims"] = {n: [lo, hi] for n, lo, hi in self.dim_bounds}
        if self.preprocess:
            d["preprocess"] = self.preprocess.to_dict()
        return d


@frozen
class DecoderSpec:
    """How outputs become a typed result.

    ``classification``: softmax (unless the output already is probabilities)
    and top-k with labels over ``output``. ``detection``: ``format`` blazeface
    (SSD anchors, weighted NMS; ``outputs`` = [box/keypoint tensor, score tensor])
    or yolo (``layout`` xywh+obj+classes | xywh+classes | xyxy+score+class), boxes
    mapped back to the source frame. ``segmentation``: a class map at source size.
    ``raw``: outputs as they are. Kind-specific settings live in ``params``.
    """

    kind: str = "raw"
    output: str | None = None
    softmax: bool = True
    top_k: int = 5
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any = None) -> Any:
        """The value of decoder parameter ``key``, or ``default``."""
        for k, v in self.params:
            if k == key:
                return v
        return default

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "DecoderSpec":
        """Parse the manifest ``decoder`` table; :class:`~edge_sdk.errors.ManifestError` (naming ``where``) for an unknown kind or key,
        or a bad value."""
        kind = _choice(_req(d, "kind", str, where), DECODERS, f"{where}.kind")
        allowed = DECODER_PARAMS[kind]
        _no_unknown(d, ("kind", "output", "softmax", "top_k", *allowed), where)
        top_k = _opt(d, "top_k", int, where, 5)
        if top_k < 1:
            raise ManifestError(f"{where}.top_k: expected >= 1, got {top_k}")
        _bounded(top_k, MAX_TOP_K, f"{where}.top_k", "MAX_TOP_K")
        if isinstance(d.get("max_detections"), int):
            _bounded(d["max_detections"], MAX_TOP_K, f"{where}.max_detections", "MAX_TOP_K")
        if isinstance(d.get("outputs"), list):
            _items(d["outputs"], MAX_LIST_ITEMS, f"{where}.outputs")
        params = []
        for k, types in allowed.items():
            if k in d:
                v = _typed(d[k], types, f"{where}.{k}")
                params.append((k, _freeze(v)))
        spec = cls(
            kind=kind,
            output=_opt(d, "output", str, where),
            softmax=_opt(d, "softmax", bool, where, True),
            top_k=top_k,
            params=tuple(params),
        )
        if kind == "detection":
            fmt = spec.param("format")
            if fmt is None:
                raise ManifestError(f"{where}.format: a detection decoder needs format = one of {list(DETECTION_FORMATS)}")
            _choice(fmt, DETECTION_FORMATS, f"{where}.format")
            if fmt == "blazeface" and len(spec.param("outputs", ())) != 2:
                raise ManifestError(
                    f"{where}.outputs: blazeface needs [box_and_keypoint_output, score_output], got {list(spec.param('outputs', ()))}"
                )
            if fmt == "yolo" and spec.param("layout") not in ("xywh+obj+classes", "xywh+classes", "xyxy+score+class"):
                raise ManifestError(
                    f"{where}.layout: yolo needs xywh+obj+classes | xywh+classes | xyxy+score+class, got {spec.param('layout')!r}"
                )
            if spec.param("nms", "weighted" if fmt == "blazeface" else "hard") not in ("hard", "weighted"):
                raise ManifestError(f"{where}.nms: expected hard or weighted, got {spec.param('nms')!r}")
            for t in ("score_threshold", "iou_threshold"):
                v = spec.param(t)
                if v is not None and not 0 <= v <= 1:
                    raise ManifestError(f"{where}.{t}: expected 0..1, got {v}")
        if kind == "segmentation" and spec.param("layout", "NCHW") not in ("NCHW", "NHWC", "NHW"):
            raise ManifestError(f"{where}.layout: expected NCHW, NHWC or NHW, got {spec.param('layout')!r}")
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        d: dict[str, Any] = {"kind": self.kind, "output": self.output, "softmax": self.softmax, "top_k": self.top_k}
        if self.output is None:  # not set: the decoder uses the model's single output (TOML has no null)
            del d["output"]
        d.update({k: _thaw(v) for k, v in self.params})
        return d


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _freeze(x)) for k, x in v.items())
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
        return {k: _thaw(x) for k, x in v}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


@frozen
class StatePair:
    """For streaming models: ``output`` of one call feeds ``input`` of the next.

    ``batch_axis``: the axis of the state tensors that holds one row per stream (Silero
    VAD's state ``[2, batch, 128]``: 1), so several streams can share one call; ``None``
    (the default): the state cannot be batched across streams."""

    input: str
    output: str
    initial: float = 0.0
    batch_axis: int | None = None


@frozen
class FileRef:
    """A file inside the package with its digest and size (bytes)."""

    file: str
    sha256: str
    size: int


@frozen
class Quality:
    """How a variant compares with the reference variant on ``dataset``:
    cosine similarity and max abs error of the outputs, top-1/top-5 agreement,
    and a task metric (``metric`` = ``value``) when labels were given."""

    reference: str | None = None
    cosine: float | None = None
    max_abs_error: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    metric: str | None = None
    value: float | None = None
    dataset: str | None = None
    samples: int | None = None
    #: text generation: teacher-forced perplexity on ``dataset`` and its relative increase over the
    #: reference's (``perplexity / reference perplexity - 1``; 0.05 = 5 % worse).
    perplexity: float | None = None
    perplexity_gap: float | None = None
    #: sequence (CTC/token) outputs ``[batch, positions, classes]``: share of positions whose argmax
    #: equals the reference's; share of samples whose decoded sequence (repeats collapsed, blanks
    #: removed) equals the reference's; mean edit distance of the decoded sequences over the longer one's length.
    position_agreement: float | None = None
    sequence_exact_match: float | None = None
    edit_distance: float | None = None
    #: detection: share of the reference's boxes the variant finds (IoU >= 0.5, same class) and the
    #: mean IoU of each reference box with its match (0 when unmatched).
    box_recall: float | None = None
    box_iou: float | None = None
    #: segmentation: mean IoU of the variant's argmax (one channel: >= 0.5) masks with the reference's.
    mask_iou: float | None = None
    #: samples (of ``samples``) where the variant's outputs hold NaN or infinity where the reference's are finite
    #: (e.g. an fp16 overflow); any is a gate failure, whatever the thresholds.
    nonfinite_samples: int | None = None

    #: The numeric figures (floats): what a :class:`Gate` threshold may name.
    FIGURES = (
        "cosine", "max_abs_error", "top1_agreement", "top5_agreement", "value", "perplexity", "perplexity_gap",
        "position_agreement", "sequence_exact_match", "edit_distance", "box_recall", "box_iou", "mask_iou",
    )  # fmt: skip
    #: Figures whose gate threshold is a maximum (the others are minimums).
    MAXIMA = ("max_abs_error", "perplexity", "perplexity_gap", "edit_distance")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "Quality":
        """Parse a variant's ``quality`` table; :class:`~edge_sdk.errors.ManifestError` (naming ``where``) for an unknown key or a wrong
        type."""
        _no_unknown(d, ("reference", "metric", "dataset", "samples", "nonfinite_samples", *cls.FIGURES), where)
        nums = {k: (None if (v := _opt(d, k, (int, float), where)) is None else float(v)) for k in cls.FIGURES}
        return cls(
            reference=_opt(d, "reference", str, where),
            metric=_opt(d, "metric", str, where),
            dataset=_opt(d, "dataset", str, where),
            samples=_opt(d, "samples", int, where),
            nonfinite_samples=_opt(d, "nonfinite_samples", int, where),
            **nums,
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest form (figures that are set)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@frozen
class Gate:
    """The quality gate a variant was held to when the package was made.

    ``thresholds``: (quality field, minimum) pairs (``max_abs_error``, ``perplexity`` and
    ``perplexity_gap`` are maxima: :data:`Quality.MAXIMA`). ``failures``: what it missed. A variant with ``passed = false``
    is only in the package because the converter was run with ``--force``
    (``forced = true``); selection skips it unless it is asked for by id.
    """

    passed: bool
    thresholds: tuple[tuple[str, float], ...] = ()
    failures: tuple[str, ...] = ()
    forced: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "Gate":
        """Parse a variant's ``gate`` table; :class:`~edge_sdk.errors.ManifestError` (naming ``where``) for an unknown key, a threshold
        that is not a quality figure, or a wrong type."""
        _no_unknown(d, ("passed", "thresholds", "failures", "forced"), where)
        th = _opt(d, "thresholds", dict, where, {})
        for k, v in th.items():
            if k not in Quality.FIGURES:
                raise ManifestError(f"{where}.thresholds.{k}: not a quality figure; expected one of {list(Quality.FIGURES)}")
            _typed(v, (int, float), f"{where}.thresholds.{k}")
        g = cls(
            passed=_req(d, "passed", bool, where),
            thresholds=tuple((k, float(v)) for k, v in th.items()),
            failures=tuple(_typed(x, str, f"{where}.failures") for x in _opt(d, "failures", list, where, [])),
            forced=_opt(d, "forced", bool, where, False),
        )
        if not g.passed and not g.forced:
            raise ManifestError(f"{where}: a variant that failed its gate may only be in a package when forced (forced = true)")
        return g

    def to_dict(self) -> dict[str, Any]:
        """The manifest form (empty parts left out)."""
        d: dict[str, Any] = {"passed": self.passed}
        if self.thresholds:
            d["thresholds"] = dict(self.thresholds)
        if self.failures:
            d["failures"] = list(self.failures)
        if self.forced:
            d["forced"] = True
        return d


@frozen
class Benchmark:
    """A latency measured when the package was made: median ms per call of
    this variant (and of the reference, in the same run) on a machine that
    resolved to ``profile``, at ``threads`` and ``batch``."""

    profile: str
    latency_ms: float
    threads: int
    batch: int = 1
    reference_latency_ms: float | None = None
    machine: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "Benchmark":
        """Parse a manifest ``benchmarks`` entry; :class:`~edge_sdk.errors.ManifestError` (naming ``where``) for an unknown key, a wrong
        type or a latency <= 0."""
        _no_unknown(d, ("profile", "latency_ms", "threads", "batch", "reference_latency_ms", "machine"), where)
        lat = float(_req(d, "latency_ms", (int, float), where))
        ref = _opt(d, "reference_latency_ms", (int, float), where)
        if lat <= 0 or (ref is not None and ref <= 0):
            raise ManifestError(f"{where}: latencies must be > 0 ms, got {lat} / {ref}")
        return cls(
            profile=_req(d, "profile", str, where),
            latency_ms=lat,
            threads=_bounded(_req(d, "threads", int, where), MAX_THREADS, f"{where}.threads", "MAX_THREADS"),
            batch=_bounded(_opt(d, "batch", int, where, 1), MAX_BATCH, f"{where}.batch", "MAX_BATCH"),
            reference_latency_ms=None if ref is None else float(ref),
            machine=_opt(d, "machine", str, where, ""),
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest form (fields that are set)."""
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ""}


def _pos_int(d: Mapping[str, Any], key: str, where: str) -> int:
    v = _req(d, key, int, where)
    if v < 1:
        raise ManifestError(f"{where}.{key}: expected an int >= 1, got {v}")
    return int(v)


def _opt_bounded(d: Mapping[str, Any], key: str, hi: int, where: str) -> int | None:
    v = _opt(d, key, int, where)
    return None if v is None else _bounded(v, hi, f"{where}.{key}")


def _opt_num(d: Mapping[str, Any], key: str, where: str, *, lo: float = 0.0) -> float | None:
    v = _opt(d, key, (int, float), where)
    if v is None:
        return None
    if not (math.isfinite(v) and v >= lo):
        raise ManifestError(f"{where}.{key}: expected a finite number >= {lo:g}, got {v!r}")
    return float(v)


@frozen
class GenerationSpec:
    """The ``[generation]`` table of a ``task = "text-generation"`` package: what every variant of a
    decoder-only language model shares (architecture facts the runtime checks the graph against,
    the tokenizer and chat template files, special token ids, the context length).

    ``tokenizer`` is a Hugging Face ``tokenizers`` JSON file; ``chat_template`` a Jinja2 file
    rendered in a sandbox (templates in a package are untrusted input). ``add_bos``: prepend
    ``bos_token_id`` to a plain ``generate(prompt)`` (a chat template writes its own).
    """

    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    tokenizer: FileRef
    chat_template: FileRef | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    add_bos: bool = False
    source: str = ""  # what the package was converted from (file name and sha256)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "GenerationSpec":
        """Parse the ``[generation]`` table; :class:`~edge_sdk.errors.ManifestError` naming the field."""
        keys = (
            "architecture", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "context_length", "tokenizer",
            "chat_template", "bos_token_id", "eos_token_ids", "pad_token_id", "add_bos", "source",
        )  # fmt: skip
        _no_unknown(d, keys, where)

        def ref(key: str) -> FileRef | None:
            if key not in d:
                return None
            e = _typed(d[key], dict, f"{where}.{key}")
            w = f"{where}.{key}"
            _no_unknown(e, ("file", "sha256", "size"), w)
            size = _req(e, "size", int, w)
            if size < 0:
                raise ManifestError(f"{w}.size: expected >= 0 bytes, got {size}")
            _bounded(size, MAX_TEXT_FILE_BYTES, f"{w}.size", "MAX_TEXT_FILE_BYTES: the file is read into memory whole")
            return FileRef(_req(e, "file", str, w), _hex64(_req(e, "sha256", str, w), f"{w}.sha256"), size)

        tok = ref("tokenizer")
        if tok is None:
            raise ManifestError(f"{where}: missing required key 'tokenizer' (a tokenizer.json file reference)")
        eos = tuple(
            _typed(x, int, f"{where}.eos_token_ids")
            for x in _items(_opt(d, "eos_token_ids", list, where, []), MAX_LIST_ITEMS, f"{where}.eos_token_ids")
        )
        spec = cls(
            architecture=_choice(_req(d, "architecture", str, where), ARCHITECTURES, f"{where}.architecture"),
            n_layers=_bounded(_pos_int(d, "n_layers", where), MAX_LAYERS, f"{where}.n_layers", "MAX_LAYERS"),
            n_heads=_bounded(_pos_int(d, "n_heads", where), MAX_LAYERS, f"{where}.n_heads", "MAX_LAYERS"),
            n_kv_heads=_bounded(_pos_int(d, "n_kv_heads", where), MAX_LAYERS, f"{where}.n_kv_heads", "MAX_LAYERS"),
            head_dim=_bounded(_pos_int(d, "head_dim", where), MAX_LAYERS, f"{where}.head_dim", "MAX_LAYERS"),
            vocab_size=_bounded(_pos_int(d, "vocab_size", where), MAX_TOKENS, f"{where}.vocab_size", "MAX_TOKENS"),
            context_length=_bounded(_pos_int(d, "context_length", where), MAX_TOKENS, f"{where}.context_length", "MAX_TOKENS"),
            tokenizer=tok,
            chat_template=ref("chat_template"),
            bos_token_id=_opt(d, "bos_token_id", int, where),
            eos_token_ids=eos,
            pad_token_id=_opt(d, "pad_token_id", int, where),
            add_bos=_opt(d, "add_bos", bool, where, False),
            source=_opt(d, "source", str, where, ""),
        )
        if spec.n_heads % spec.n_kv_heads:
            raise ManifestError(f"{where}: n_heads ({spec.n_heads}) must be a multiple of n_kv_heads ({spec.n_kv_heads})")
        for name, tid in [("bos_token_id", spec.bos_token_id), ("pad_token_id", spec.pad_token_id)] + [("eos_token_ids", e) for e in eos]:
            if tid is not None and not 0 <= tid < spec.vocab_size:
                raise ManifestError(f"{where}.{name}: token id {tid} is outside the vocabulary [0, {spec.vocab_size})")
        if spec.add_bos and spec.bos_token_id is None:
            raise ManifestError(f"{where}.add_bos: true needs a bos_token_id")
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        d: dict[str, Any] = {
            k: getattr(self, k) for k in ("architecture", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "context_length")
        }
        d["tokenizer"] = {"file": self.tokenizer.file, "sha256": self.tokenizer.sha256, "size": self.tokenizer.size}
        if self.chat_template is not None:
            d["chat_template"] = {"file": self.chat_template.file, "sha256": self.chat_template.sha256, "size": self.chat_template.size}
        for k in ("bos_token_id", "pad_token_id"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["add_bos"] = self.add_bos
        if self.source:
            d["source"] = self.source
        return d


@frozen
class VariantGeneration:
    """A text-generation variant's ``generation`` table: how its weights are stored and what one
    token costs.

    ``bits``: weight bits of the linear layers (4, 8, 16, 32); ``method``: the int4/int8 quantizer
    ("rtn", "rtn_sym", "hqq", "gptq", ...); ``int8_tensors``: tensors kept in 8 bits in an int4
    variant (mixed precision); ``accuracy_level``: MatMulNBits' (4 = int8 activations, fast on CPU,
    not batch-invariant); ``kv_bytes_per_token`` = 2 x layers x kv_heads x head_dim x bytes of
    ``kv_dtype``; ``weight_bytes_per_token``: bytes of weights each decode step reads;
    ``ttft_ms``/``tpot_ms``: time to first token and per output token measured when converted
    (``bench_prompt_tokens`` prompt, ``bench_threads`` threads, on ``bench_machine``).
    """

    bits: int
    kv_dtype: str
    kv_bytes_per_token: int
    weight_bytes_per_token: int
    method: str = ""
    block_size: int | None = None
    accuracy_level: int | None = None
    int8_tensors: tuple[str, ...] = ()
    batch_invariant: bool = True
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    bench_prompt_tokens: int | None = None
    bench_threads: int | None = None
    bench_machine: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "VariantGeneration":
        """Parse a variant's ``generation`` table; :class:`~edge_sdk.errors.ManifestError` naming the field."""
        keys = (
            "bits", "kv_dtype", "kv_bytes_per_token", "weight_bytes_per_token", "method", "block_size", "accuracy_level", "int8_tensors",
            "batch_invariant", "ttft_ms", "tpot_ms", "bench_prompt_tokens", "bench_threads", "bench_machine",
        )  # fmt: skip
        _no_unknown(d, keys, where)
        bits = _req(d, "bits", int, where)
        if bits not in (4, 8, 16, 32):
            raise ManifestError(f"{where}.bits: expected 4, 8, 16 or 32, got {bits}")
        block = _opt(d, "block_size", int, where)
        if block is not None and (block < 16 or block & (block - 1)):
            raise ManifestError(f"{where}.block_size: expected a power of two >= 16, got {block}")
        acc = _opt(d, "accuracy_level", int, where)
        if acc is not None and not 0 <= acc <= 4:
            raise ManifestError(f"{where}.accuracy_level: expected 0..4, got {acc}")
        g = cls(
            bits=bits,
            kv_dtype=_choice(_req(d, "kv_dtype", str, where), KV_DTYPES, f"{where}.kv_dtype"),
            kv_bytes_per_token=_bounded(
                _pos_int(d, "kv_bytes_per_token", where), MAX_KV_BYTES_PER_TOKEN, f"{where}.kv_bytes_per_token", "MAX_KV_BYTES_PER_TOKEN"
            ),
            weight_bytes_per_token=_bounded(
                _pos_int(d, "weight_bytes_per_token", where), MAX_FILE_BYTES, f"{where}.weight_bytes_per_token", "MAX_FILE_BYTES"
            ),
            method=_opt(d, "method", str, where, ""),
            block_size=block,
            accuracy_level=acc,
            int8_tensors=tuple(
                _typed(x, str, f"{where}.int8_tensors")
                for x in _items(_opt(d, "int8_tensors", list, where, []), 1 << 16, f"{where}.int8_tensors")
            ),
            batch_invariant=_opt(d, "batch_invariant", bool, where, True),
            ttft_ms=_opt_num(d, "ttft_ms", where),
            tpot_ms=_opt_num(d, "tpot_ms", where),
            bench_prompt_tokens=_opt_bounded(d, "bench_prompt_tokens", MAX_TOKENS, where),
            bench_threads=_opt_bounded(d, "bench_threads", MAX_THREADS, where),
            bench_machine=_opt(d, "bench_machine", str, where, ""),
        )
        return g

    def to_dict(self) -> dict[str, Any]:
        """The manifest form (unset figures left out)."""
        d: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            if v is None or v == "" or v == ():
                continue
            d[k] = list(v) if isinstance(v, tuple) else v
        return d


@frozen
class Variant:
    """One runnable file of the model: backend, precision, digest, quality.

    ``inputs``/``outputs`` override the package-level specs for this variant
    (e.g. a TFLite variant in NHWC layout next to an ONNX one in NCHW).
    """

    id: str
    file: str
    backend: str
    precision: str
    sha256: str
    size: int
    reference: bool = False
    external_data: tuple[FileRef, ...] = ()
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    quality: Quality | None = None
    gate: Gate | None = None
    benchmarks: tuple[Benchmark, ...] = ()
    temperature: float | None = None  # classification: scores = softmax(logits / T) (see docs/package-format.md)
    generation: VariantGeneration | None = None  # text-generation packages: weights and per-token costs

    @property
    def format(self) -> str:
        """The file format the variant's backend reads (``onnx`` or ``tflite``)."""
        return BACKEND_FORMATS[self.backend]

    @property
    def total_size(self) -> int:
        """Bytes of the model file plus its external data files."""
        return self.size + sum(f.size for f in self.external_data)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "Variant":
        """Parse one ``variants`` entry; :class:`~edge_sdk.errors.ManifestError` (naming ``where`` and the id) for an unknown key or a
        bad value."""
        _no_unknown(
            d,
            (
                "id",
                "file",
                "backend",
                "precision",
                "sha256",
                "size",
                "reference",
                "external_data",
                "inputs",
                "outputs",
                "quality",
                "gate",
                "benchmarks",
                "temperature",
                "generation",
            ),
            where,
        )
        vid = _req(d, "id", str, where)
        where = f"{where}[{vid}]"
        ext = []
        for i, e in enumerate(_items(_opt(d, "external_data", list, where, []), MAX_EXTERNAL_FILES, f"{where}.external_data")):
            w = f"{where}.external_data[{i}]"
            e = _typed(e, dict, w)
            _no_unknown(e, ("file", "sha256", "size"), w)
            esize = _req(e, "size", int, w)
            if esize < 0:
                raise ManifestError(f"{w}.size: expected >= 0 bytes, got {esize}")
            _bounded(esize, MAX_FILE_BYTES, f"{w}.size", "MAX_FILE_BYTES")
            ext.append(FileRef(_req(e, "file", str, w), _hex64(_req(e, "sha256", str, w), f"{w}.sha256"), esize))
        ins = outs = None
        if "inputs" in d:
            ins = tuple(
                TensorSpec.from_dict(_typed(x, dict, f"{where}.inputs"), f"{where}.inputs", is_input=True)
                for x in _items(_typed(d["inputs"], list, f"{where}.inputs"), MAX_TENSORS, f"{where}.inputs")
            )
        if "outputs" in d:
            outs = tuple(
                TensorSpec.from_dict(_typed(x, dict, f"{where}.outputs"), f"{where}.outputs", is_input=False)
                for x in _items(_typed(d["outputs"], list, f"{where}.outputs"), MAX_TENSORS, f"{where}.outputs")
            )
        size = _req(d, "size", int, where)
        if size <= 0:
            raise ManifestError(f"{where}.size: expected > 0 bytes, got {size}")
        _bounded(size, MAX_FILE_BYTES, f"{where}.size", "MAX_FILE_BYTES")
        _bounded(size + sum(f.size for f in ext), MAX_FILE_BYTES, f"{where}: size with external_data", "MAX_FILE_BYTES")
        temperature = _opt(d, "temperature", (int, float), where)
        if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
            raise ManifestError(f"{where}.temperature: expected a finite number > 0, got {temperature!r}")
        return cls(
            id=vid,
            file=_req(d, "file", str, where),
            backend=_choice(_req(d, "backend", str, where), BACKENDS, f"{where}.backend"),
            precision=_choice(_req(d, "precision", str, where), PRECISIONS, f"{where}.precision"),
            sha256=_hex64(_req(d, "sha256", str, where), f"{where}.sha256"),
            size=size,
            reference=_opt(d, "reference", bool, where, False),
            external_data=tuple(ext),
            inputs=ins,
            outputs=outs,
            quality=Quality.from_dict(_typed(d["quality"], dict, f"{where}.quality"), f"{where}.quality") if "quality" in d else None,
            gate=Gate.from_dict(_typed(d["gate"], dict, f"{where}.gate"), f"{where}.gate") if "gate" in d else None,
            benchmarks=tuple(
                Benchmark.from_dict(_typed(b, dict, f"{where}.benchmarks[{i}]"), f"{where}.benchmarks[{i}]")
                for i, b in enumerate(_items(_opt(d, "benchmarks", list, where, []), MAX_LIST_ITEMS, f"{where}.benchmarks"))
            ),
            temperature=None if temperature is None else float(temperature),
            generation=(
                VariantGeneration.from_dict(_typed(d["generation"], dict, f"{where}.generation"), f"{where}.generation")
                if "generation" in d
                else None
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        d: dict[str, Any] = {
            "id": self.id,
            "file": self.file,
            "backend": self.backend,
            "precision": self.precision,
            "sha256": self.sha256,
            "size": self.size,
        }
        if self.reference:
            d["reference"] = True
        if self.external_data:
            d["external_data"] = [f.__dict__.copy() for f in self.external_data]
        if self.inputs is not None:
            d["inputs"] = [t.to_dict() for t in self.inputs]
        if self.outputs is not None:
            d["outputs"] = [t.to_dict() for t in self.outputs]
        if self.quality is not None:
            d["quality"] = self.quality.to_dict()
        if self.gate is not None:
            d["gate"] = self.gate.to_dict()
        if self.benchmarks:
            d["benchmarks"] = [b.to_dict() for b in self.benchmarks]
        if self.temperature is not None:
            d["temperature"] = self.temperature
        if self.generation is not None:
            d["generation"] = self.generation.to_dict()
        return d


@frozen
class Golden:
    """Golden inputs and expected outputs a store health-checks a package with.

    ``inputs`` / ``outputs``: ``.npz`` files in the package (one array per
    tensor name; read with ``allow_pickle=False``), covered by ``inputs_sha256``
    / ``outputs_sha256``. An output passes when ``allclose(got, want, rtol,
    atol)``. ``max_latency_ms``: the best of a few timed calls must be under
    this; ``timeout_s``: the whole check (load included) must finish in time.
    """

    inputs: str
    outputs: str
    inputs_sha256: str
    outputs_sha256: str
    atol: float = 1e-5
    rtol: float = 1e-4
    max_latency_ms: float | None = None
    timeout_s: float = 60.0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "Golden":
        """Parse the manifest ``golden`` table; :class:`~edge_sdk.errors.ManifestError` (naming ``where``) for an unknown key, a bad
        digest or a wrong type."""
        _no_unknown(d, ("inputs", "outputs", "inputs_sha256", "outputs_sha256", "atol", "rtol", "max_latency_ms", "timeout_s"), where)
        lat = _opt(d, "max_latency_ms", (int, float), where)
        g = cls(
            inputs=_req(d, "inputs", str, where),
            outputs=_req(d, "outputs", str, where),
            inputs_sha256=_hex64(_req(d, "inputs_sha256", str, where), f"{where}.inputs_sha256"),
            outputs_sha256=_hex64(_req(d, "outputs_sha256", str, where), f"{where}.outputs_sha256"),
            atol=float(_opt(d, "atol", (int, float), where, 1e-5)),
            rtol=float(_opt(d, "rtol", (int, float), where, 1e-4)),
            max_latency_ms=None if lat is None else float(lat),
            timeout_s=float(_opt(d, "timeout_s", (int, float), where, 60.0)),
        )
        for rel, key in ((g.inputs, "inputs"), (g.outputs, "outputs")):
            check_relpath(rel, f"{where}.{key}")
        nums = [g.atol, g.rtol, g.timeout_s] + ([g.max_latency_ms] if g.max_latency_ms is not None else [])
        if not all(math.isfinite(x) and x >= 0 for x in nums) or g.timeout_s <= 0:
            raise ManifestError(f"{where}: atol, rtol, max_latency_ms must be finite and >= 0, timeout_s > 0")
        return g

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        d: dict[str, Any] = {
            "inputs": self.inputs, "outputs": self.outputs, "inputs_sha256": self.inputs_sha256,
            "outputs_sha256": self.outputs_sha256, "atol": self.atol, "rtol": self.rtol, "timeout_s": self.timeout_s,
        }  # fmt: skip
        if self.max_latency_ms is not None:
            d["max_latency_ms"] = self.max_latency_ms
        return d


@frozen
class ReferenceStatsRef:
    """The manifest's ``[reference_stats]`` table: reference statistics of the inputs and outputs
    (``reference_stats.json``, written by ``edge-convert``; see docs/quality.md), covered by
    ``sha256`` and ``size`` like a model file."""

    file: str
    sha256: str
    size: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "ReferenceStatsRef":
        """Parse the table; :class:`~edge_sdk.errors.ManifestError` (naming ``where``) for an unknown key, a bad digest or size."""
        _no_unknown(d, ("file", "sha256", "size"), where)
        r = cls(_req(d, "file", str, where), _hex64(_req(d, "sha256", str, where), f"{where}.sha256"), _req(d, "size", int, where))
        check_relpath(r.file, f"{where}.file")
        if isinstance(r.size, bool) or r.size < 0:
            raise ManifestError(f"{where}.size: expected a byte count >= 0, got {r.size!r}")
        _bounded(r.size, MAX_TEXT_FILE_BYTES, f"{where}.size", "MAX_TEXT_FILE_BYTES: the file is read into memory whole")
        return r

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        return {"file": self.file, "sha256": self.sha256, "size": self.size}


@frozen
class Manifest:
    """The parsed ``edge-model.toml`` (see docs/ARCHITECTURE.md for the schema)."""

    name: str
    version: str
    task: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    variants: tuple[Variant, ...]
    decoder: DecoderSpec = field(default_factory=DecoderSpec)
    labels: tuple[str, ...] = ()
    state: tuple[StatePair, ...] = ()
    description: str = ""
    schema: int = SCHEMA_VERSION
    golden: Golden | None = None
    reference_stats: ReferenceStatsRef | None = None
    generation: GenerationSpec | None = None  # task = "text-generation": the decoder's shared facts

    def variant(self, vid: str) -> Variant:
        """The variant with id ``vid``; ``KeyError`` if there is none."""
        for v in self.variants:
            if v.id == vid:
                return v
        raise KeyError(vid)

    def inputs_for(self, v: Variant) -> tuple[TensorSpec, ...]:
        """Variant ``v``'s inputs: its own if it declares them (e.g. NHWC for TFLite), else the manifest's."""
        return v.inputs if v.inputs is not None else self.inputs

    def outputs_for(self, v: Variant) -> tuple[TensorSpec, ...]:
        """Variant ``v``'s outputs: its own if it declares them, else the manifest's."""
        return v.outputs if v.outputs is not None else self.outputs

    @property
    def reference_variant(self) -> Variant:
        """The variant marked ``reference`` (the others are measured against it), else the first."""
        for v in self.variants:
            if v.reference:
                return v
        return self.variants[0]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = MANIFEST_NAME) -> "Manifest":
        """Parse and check a whole manifest (as read from ``edge-model.toml``); :class:`~edge_sdk.errors.ManifestError` naming ``source``
        and the field for anything wrong."""
        w = source
        top = (
            "schema", "name", "version", "task", "description", "inputs", "outputs", "decoder", "labels", "state", "variants", "golden",
            "reference_stats", "generation",
        )  # fmt: skip
        _no_unknown(d, top, w)
        schema = _req(d, "schema", int, w)
        if schema != SCHEMA_VERSION:
            raise ManifestError(f"{w}.schema: this edge_sdk reads schema {SCHEMA_VERSION}, got {schema}")
        ins = tuple(
            TensorSpec.from_dict(_typed(x, dict, f"{w}.inputs"), f"{w}.inputs", is_input=True)
            for x in _items(_req(d, "inputs", list, w), MAX_TENSORS, f"{w}.inputs")
        )
        outs = tuple(
            TensorSpec.from_dict(_typed(x, dict, f"{w}.outputs"), f"{w}.outputs", is_input=False)
            for x in _items(_req(d, "outputs", list, w), MAX_TENSORS, f"{w}.outputs")
        )
        if not ins or not outs:
            raise ManifestError(f"{w}: needs at least one input and one output")
        variants = tuple(
            Variant.from_dict(_typed(x, dict, f"{w}.variants"), f"{w}.variants")
            for x in _items(_req(d, "variants", list, w), MAX_VARIANTS, f"{w}.variants")
        )
        if not variants:
            raise ManifestError(f"{w}.variants: at least one variant is required")
        labels = tuple(_typed(x, str, f"{w}.labels") for x in _items(_opt(d, "labels", list, w, []), MAX_LABELS, f"{w}.labels"))
        decoder = DecoderSpec.from_dict(_typed(d["decoder"], dict, f"{w}.decoder"), f"{w}.decoder") if "decoder" in d else DecoderSpec()
        state = []
        for i, s in enumerate(_items(_opt(d, "state", list, w, []), MAX_LIST_ITEMS, f"{w}.state")):
            ws = f"{w}.state[{i}]"
            s = _typed(s, dict, ws)
            _no_unknown(s, ("input", "output", "initial", "batch_axis"), ws)
            state.append(
                StatePair(
                    _req(s, "input", str, ws),
                    _req(s, "output", str, ws),
                    float(_opt(s, "initial", (int, float), ws, 0.0)),
                    _opt(s, "batch_axis", int, ws),
                )
            )
        m = cls(
            name=_req(d, "name", str, w),
            version=_req(d, "version", str, w),
            task=_choice(_req(d, "task", str, w), TASKS, f"{w}.task"),
            description=_opt(d, "description", str, w, ""),
            inputs=ins,
            outputs=outs,
            variants=variants,
            decoder=decoder,
            labels=labels,
            state=tuple(state),
            schema=schema,
            golden=Golden.from_dict(_typed(d["golden"], dict, f"{w}.golden"), f"{w}.golden") if "golden" in d else None,
            reference_stats=(
                ReferenceStatsRef.from_dict(_typed(d["reference_stats"], dict, f"{w}.reference_stats"), f"{w}.reference_stats")
                if "reference_stats" in d
                else None
            ),
            generation=GenerationSpec.from_dict(_typed(d["generation"], dict, f"{w}.generation"), f"{w}.generation")
            if "generation" in d
            else None,
        )
        m._check_cross(w)
        return m

    def _check_cross(self, w: str) -> None:
        """Every rule that spans several fields, in one place."""
        ids = [v.id for v in self.variants]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ManifestError(f"{w}.variants: duplicate id(s) {dup}")
        if sum(v.reference for v in self.variants) > 1:
            raise ManifestError(f"{w}.variants: at most one variant may be the reference")
        if (self.task == "text-generation") != (self.generation is not None):
            raise ManifestError(f"{w}: a [generation] table goes with task = 'text-generation' and it needs one (task is {self.task!r})")
        for v in self.variants:
            if (v.generation is not None) != (self.generation is not None):
                raise ManifestError(
                    f"{w}.variants[{v.id}].generation: every variant of a text-generation package has one, no other variant does"
                )
            if v.generation is not None and v.backend != "onnxruntime":
                raise ManifestError(f"{w}.variants[{v.id}]: text generation runs on onnxruntime, not {v.backend!r}")
        for v in self.variants:
            if v.temperature is not None and self.decoder.kind != "classification":
                raise ManifestError(
                    f"{w}.variants[{v.id}].temperature: applies only with a classification decoder, not {self.decoder.kind!r}"
                )
        for v in self.variants:
            vin, vout = self.inputs_for(v), self.outputs_for(v)
            for kind, specs in (("inputs", vin), ("outputs", vout)):
                names = [s.name for s in specs]
                if len(set(names)) != len(names):
                    raise ManifestError(f"{w}: variant {v.id} has duplicate {kind} names {names}")
            if {s.name for s in vin} != {s.name for s in self.inputs} or {s.name for s in vout} != {s.name for s in self.outputs}:
                raise ManifestError(
                    f"{w}: variant {v.id} overrides must keep the package's tensor names "
                    f"(inputs {[s.name for s in self.inputs]}, outputs {[s.name for s in self.outputs]})"
                )
        out_names = {s.name for s in self.outputs}
        in_names = {s.name for s in self.inputs}
        if self.decoder.kind == "detection":
            wanted = list(self.decoder.param("outputs", ())) or ([self.decoder.output] if self.decoder.output else [])
            missing = [o for o in wanted if o not in out_names]
            if missing:
                raise ManifestError(f"{w}.decoder: output(s) {missing} are not outputs {sorted(out_names)}")
            if not any(s.preprocess for s in self.inputs):
                raise ManifestError(f"{w}.decoder: a detection decoder needs an image input with preprocessing (its size maps boxes back)")
        if self.decoder.kind in ("classification", "segmentation"):
            if self.decoder.output is None and len(self.outputs) != 1:
                raise ManifestError(f"{w}.decoder.output: required when the model has {len(self.outputs)} outputs")
            if self.decoder.output is not None and self.decoder.output not in out_names:
                raise ManifestError(f"{w}.decoder.output: {self.decoder.output!r} is not an output {sorted(out_names)}")
        if self.labels and (self.decoder.kind == "classification" or self.task == "classification"):
            # The class axis is the last one: a fixed size there must match the label count.
            for v in self.variants:
                out = next(t for t in self.outputs_for(v) if t.name == (self.decoder.output or self.outputs[0].name))
                classes = out.shape[-1] if out.shape else None
                if isinstance(classes, int) and classes != len(self.labels):
                    raise ManifestError(
                        f"{w}.labels: {len(self.labels)} labels for output {out.name!r} with {classes} classes "
                        f"(shape {list(out.shape)}{'' if v is self.variants[0] else ', variant ' + v.id}); expected one label per class"
                    )
        for s in self.state:
            if s.input not in in_names or s.output not in out_names:
                raise ManifestError(f"{w}.state: pair {s.input}<-{s.output} must name an input and an output")
            a = next(t for t in self.inputs if t.name == s.input)
            b = next(t for t in self.outputs if t.name == s.output)
            if a.dtype != b.dtype or len(a.shape) != len(b.shape):
                raise ManifestError(
                    f"{w}.state: {s.input} ({a.dtype}, rank {len(a.shape)}) and {s.output} ({b.dtype}, rank {len(b.shape)}) must match"
                )
            if s.batch_axis is not None:
                for v in self.variants:
                    rank = next(t for t in self.inputs_for(v) if t.name == s.input).rank
                    if not 0 <= s.batch_axis < rank:
                        raise ManifestError(
                            f"{w}.state: pair {s.input}<-{s.output}: batch_axis must be in [0, {rank}) (the rank of {s.input!r}"
                            f"{'' if v.inputs is None else f' in variant {v.id}'}), got {s.batch_axis}"
                        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest form (what ``edge-model.toml`` holds)."""
        d: dict[str, Any] = {
            "schema": self.schema,
            "name": self.name,
            "version": self.version,
            "task": self.task,
        }
        if self.description:
            d["description"] = self.description
        if self.labels:
            d["labels"] = list(self.labels)
        d["decoder"] = self.decoder.to_dict()
        d["inputs"] = [t.to_dict() for t in self.inputs]
        d["outputs"] = [t.to_dict() for t in self.outputs]
        if self.state:
            d["state"] = [
                {
                    "input": s.input,
                    "output": s.output,
                    "initial": s.initial,
                    **({} if s.batch_axis is None else {"batch_axis": s.batch_axis}),
                }
                for s in self.state
            ]
        d["variants"] = [v.to_dict() for v in self.variants]
        if self.golden is not None:
            d["golden"] = self.golden.to_dict()
        if self.reference_stats is not None:
            d["reference_stats"] = self.reference_stats.to_dict()
        if self.generation is not None:
            d["generation"] = self.generation.to_dict()
        return d

    def to_toml(self) -> str:
        """The manifest as TOML text."""
        return _toml.dumps(self.to_dict())


def check_relpath(rel: str, what: str) -> PurePosixPath:
    """``rel`` as a path, if it is relative, POSIX and free of '..' (as every manifest path must be); else
    :class:`~edge_sdk.errors.UnsafePackageError` naming ``what``."""
    if not rel or "\x00" in rel or "\\" in rel:
        raise UnsafePackageError(f"{what}: path {rel!r} must be a non-empty relative POSIX path")
    p = PurePosixPath(rel)
    if p.is_absolute() or rel.startswith("/"):
        raise UnsafePackageError(f"{what}: absolute path {rel!r} is not allowed; paths are relative to the package")
    if any(part == ".." for part in p.parts):
        raise UnsafePackageError(f"{what}: path {rel!r} contains '..' and would escape the package")
    return p
