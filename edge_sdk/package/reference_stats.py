"""Reference statistics of a model's inputs and outputs, and the summaries both sides compute.

A *summary* is one number per batch row that the converter records over its validation data and
the on-device :class:`~edge_sdk.quality.monitor.QualityMonitor` records over sampled requests,
with the very same code (:class:`Extractor`), so the two sides are comparable:

- image inputs (an input with ``preprocess``): computed on the model-ready tensor turned back into
  pixels (``(x * std + mean) / scale``, colour order from the manifest), i.e. the resized image
  the model sees, in 0..255 units, on a strided grid of about 64x64 pixels (every k-th row and column; the
  same grid on both sides, so sharpness means "difference of pixels k apart"). Why not the decoded frame: every entry point (``predict`` with a
  tensor, ``predict_image``, pipelines) has the tensor, it is small (the model's input size, so the
  cost is bounded whatever the camera resolution) and the converter's calibration data are already
  such tensors; un-normalising keeps the numbers readable. Summaries: ``brightness`` (mean luma,
  BT.601 weights), ``contrast`` (luma standard deviation), ``sharpness`` (mean absolute difference of
  neighbouring luma pixels: blur lowers it), ``mean_<channel>`` per channel.
- other float inputs (sensor windows ``[batch, features]`` or ``[batch, time, features]``): the
  mean of each feature over the window, ``f<i>`` (the first :data:`MAX_FEATURES`), plus per feature
  mean/std/min/max and missingness (non-finite fraction) in the reference.
- classification outputs: ``confidence`` (top-1 probability: softmax of the logits when the
  decoder applies one) and the class distribution (top-1 class index, a categorical summary);
  ``low_confidence`` rate (top-1 below a threshold: abstention).
- detection outputs: ``count`` (detections per image) and ``box_area`` (mean box area as a
  fraction of the model input).
- any other output: ``<output>.mean`` (mean of the row).

Each continuous summary keeps, in the reference, the reference quantiles (101 points), a CDF table
(for the Kolmogorov-Smirnov test) and a histogram with *fixed* edges: the reference deciles (the
bucketing NannyML and most PSI write-ups use), open-ended at both sides so device values outside
the reference range still fall in a bin. The stats are JSON (``reference_stats.json`` in a package,
covered by digest in the manifest's ``[reference_stats]`` table).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ModelPackageError

FORMAT = "edge-sdk-reference-stats"
VERSION = 1
MAX_FEATURES = 32  # per-feature summaries of a sensor input beyond this are left out (stats are kept)
N_BINS = 10  # histogram bins (reference deciles)
CDF_POINTS = 512  # at most this many points of the reference CDF are stored
IMAGE_SIDE = 64  # image summaries use every k-th pixel of each row and column, k = min(height, width) // IMAGE_SIDE (at least 1)
LOW_CONFIDENCE = 0.5  # a top-1 probability under this counts as low confidence (abstention)
_LUMA = {"R": 0.299, "G": 0.587, "B": 0.114}


class ReferenceStatsError(ModelPackageError, ValueError):
    """Reference statistics that cannot be read or do not fit the model (the message says what was expected)."""


@dataclass(frozen=True)
class Summary:
    """The reference distribution of one continuous summary.

    ``edges``: interior bin edges (increasing); bins are ``(-inf, e0], (e0, e1], ..., (e_last, inf)``.
    ``fractions``: the reference's share of each bin (``len(edges) + 1``, sums to 1).
    ``cdf_x`` / ``cdf_p``: the reference's empirical CDF at up to :data:`CDF_POINTS` distinct values
    (``cdf_p`` = share of reference values <= ``cdf_x``). ``n``: reference values behind it."""

    edges: tuple[float, ...]
    fractions: tuple[float, ...]
    cdf_x: tuple[float, ...]
    cdf_p: tuple[float, ...]
    n: int
    mean: float
    std: float
    min: float
    max: float

    @classmethod
    def of(cls, values: np.ndarray, bins: int = N_BINS) -> "Summary":
        """The summary of reference ``values`` (non-finite ones left out): decile edges, shares, CDF table, moments."""
        v = np.asarray(values, np.float64).ravel()
        v = v[np.isfinite(v)]
        if v.size == 0:
            raise ReferenceStatsError("a summary needs at least one finite reference value, got none")
        edges = np.unique(np.quantile(v, np.linspace(0, 1, bins + 1)[1:-1]))
        counts = np.bincount(bin_index(edges, v), minlength=edges.size + 1)
        ux, uc = np.unique(v, return_counts=True)
        cp = np.cumsum(uc) / v.size
        if ux.size > CDF_POINTS:
            keep = np.unique(np.linspace(0, ux.size - 1, CDF_POINTS).round().astype(int))
            ux, cp = ux[keep], cp[keep]
        return cls(
            tuple(float(e) for e in edges), tuple(float(c) for c in counts / v.size), tuple(float(x) for x in ux),
            tuple(float(p) for p in cp), int(v.size), float(v.mean()), float(v.std()), float(v.min()), float(v.max()),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "edges": list(self.edges), "fractions": list(self.fractions), "cdf_x": list(self.cdf_x), "cdf_p": list(self.cdf_p),
            "n": self.n, "mean": self.mean, "std": self.std, "min": self.min, "max": self.max,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Summary":
        """Parse the JSON form strictly; :class:`ReferenceStatsError` naming ``where`` and the field."""
        d = _dict(d, where, ("edges", "fractions", "cdf_x", "cdf_p", "n", "mean", "std", "min", "max"))
        edges, fr = _floats(d["edges"], f"{where}.edges"), _floats(d["fractions"], f"{where}.fractions")
        cx, cp = _floats(d["cdf_x"], f"{where}.cdf_x"), _floats(d["cdf_p"], f"{where}.cdf_p")
        if len(fr) != len(edges) + 1 or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ReferenceStatsError(f"{where}: expected increasing edges and len(fractions) == len(edges) + 1, got {len(edges)} edges, {len(fr)} fractions")
        if any(f < 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
            raise ReferenceStatsError(f"{where}.fractions: expected non-negative shares summing to 1, got sum {sum(fr)}")
        if not cx or len(cx) != len(cp) or any(b <= a for a, b in zip(cx, cx[1:])) or any(b < a for a, b in zip(cp, cp[1:])):
            raise ReferenceStatsError(f"{where}: expected cdf_x increasing and cdf_p non-decreasing, of one length >= 1")
        n = d["n"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ReferenceStatsError(f"{where}.n: expected an int >= 1, got {n!r}")
        nums = [_num(d[k], f"{where}.{k}") for k in ("mean", "std", "min", "max")]
        return cls(tuple(edges), tuple(fr), tuple(cx), tuple(cp), n, *nums)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """The reference CDF at ``x`` (linear between the stored points, 0 below, 1 above)."""
        p: np.ndarray = np.interp(x, self.cdf_x, self.cdf_p, left=0.0, right=1.0)
        return p


def bin_index(edges: Sequence[float] | np.ndarray, values: np.ndarray) -> np.ndarray:
    """The bin of each value for interior ``edges`` (bin i: ``edges[i-1] < v <= edges[i]``)."""
    return np.searchsorted(np.asarray(edges, np.float64), values, side="left")


@dataclass(frozen=True)
class ReferenceStats:
    """Reference statistics of a model (see the module docstring). ``summaries``: name ->
    :class:`Summary` (continuous); ``classes``: share of each class among top-1 predictions
    (classification), else empty; ``low_confidence_rate``: share of reference rows whose top-1
    probability is under ``low_confidence`` (classification). ``inputs``: per input, what kind of
    summaries it has and its descriptive stats (per-channel mean/std for images; per-feature
    mean/std/min/max/missing for sensor inputs). ``samples``: rows the stats come from."""

    summaries: Mapping[str, Summary]
    samples: int
    inputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    output_kind: str = "raw"
    classes: tuple[float, ...] = ()
    labels: tuple[str, ...] = ()
    low_confidence: float = LOW_CONFIDENCE
    low_confidence_rate: float | None = None
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what ``reference_stats.json`` holds)."""
        return {
            "format": FORMAT, "version": VERSION, "samples": self.samples, "source": self.source,
            "inputs": {k: dict(v) for k, v in self.inputs.items()}, "output_kind": self.output_kind,
            "classes": list(self.classes), "labels": list(self.labels), "low_confidence": self.low_confidence,
            "low_confidence_rate": self.low_confidence_rate, "summaries": {k: s.to_dict() for k, s in self.summaries.items()},
        }  # fmt: skip

    def to_json(self) -> str:
        """The JSON text (no NaN or Infinity)."""
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: Any, where: str = "reference stats") -> "ReferenceStats":
        """Parse (strictly: unknown keys, wrong types and inconsistent shares are
        :class:`ReferenceStatsError` naming the field)."""
        keys = ("format", "version", "samples", "source", "inputs", "output_kind", "classes", "labels", "low_confidence", "low_confidence_rate", "summaries")
        d = _dict(d, where, keys)
        if d["format"] != FORMAT or d["version"] != VERSION:
            raise ReferenceStatsError(f"{where}: expected format {FORMAT!r} version {VERSION}, got {d['format']!r} version {d['version']!r}")
        if not isinstance(d["samples"], int) or isinstance(d["samples"], bool) or d["samples"] < 1:
            raise ReferenceStatsError(f"{where}.samples: expected an int >= 1, got {d['samples']!r}")
        if d["output_kind"] not in ("classification", "detection", "raw"):
            raise ReferenceStatsError(f"{where}.output_kind: expected classification, detection or raw, got {d['output_kind']!r}")
        if not isinstance(d["summaries"], dict) or not isinstance(d["inputs"], dict) or not isinstance(d["source"], str):
            raise ReferenceStatsError(f"{where}: expected summaries and inputs to be objects and source a string")
        classes = _floats(d["classes"], f"{where}.classes")
        if classes and (any(c < 0 for c in classes) or abs(sum(classes) - 1.0) > 1e-6):
            raise ReferenceStatsError(f"{where}.classes: expected non-negative shares summing to 1, got sum {sum(classes)}")
        labels = d["labels"]
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise ReferenceStatsError(f"{where}.labels: expected a list of strings")
        lcr = d["low_confidence_rate"]
        return cls(
            summaries={str(k): Summary.from_dict(v, f"{where}.summaries.{k}") for k, v in d["summaries"].items()},
            samples=d["samples"],
            inputs={str(k): _dict(v, f"{where}.inputs.{k}", None) for k, v in d["inputs"].items()},
            output_kind=d["output_kind"],
            classes=tuple(classes),
            labels=tuple(labels),
            low_confidence=_num(d["low_confidence"], f"{where}.low_confidence"),
            low_confidence_rate=None if lcr is None else _num(lcr, f"{where}.low_confidence_rate"),
            source=d["source"],
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "reference stats") -> "ReferenceStats":
        """Parse JSON text (see :meth:`from_dict`); :class:`ReferenceStatsError` if it is not JSON."""
        try:
            d = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ReferenceStatsError(f"{where}: expected JSON, got: {e}") from e
        return cls.from_dict(d, where)

    @classmethod
    def load(cls, path: str | Path) -> "ReferenceStats":
        """Read a ``reference_stats.json`` file (not digest-checked: use ``Model.reference_stats`` for a package's)."""
        p = Path(path)
        return cls.from_json(p.read_bytes(), str(p))

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path``; returns it."""
        p = Path(path)
        p.write_text(self.to_json())
        return p


def _dict(d: Any, where: str, keys: Sequence[str] | None) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ReferenceStatsError(f"{where}: expected an object, got {type(d).__name__}")
    if keys is not None:
        unknown, missing = sorted(set(d) - set(keys)), sorted(set(keys) - set(d))
        if unknown or missing:
            raise ReferenceStatsError(f"{where}: expected keys {list(keys)}; unknown {unknown}, missing {missing}")
    return d


def _num(x: Any, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ReferenceStatsError(f"{where}: expected a finite number, got {x!r}")
    return float(x)


def _floats(x: Any, where: str) -> list[float]:
    if not isinstance(x, list):
        raise ReferenceStatsError(f"{where}: expected a list of numbers, got {type(x).__name__}")
    return [_num(v, f"{where}[{i}]") for i, v in enumerate(x)]


# ------------------------------------------------------------------------------------------------
# extraction: the same code on both sides


def _feature_axis(spec: Any) -> int | None:
    """The axis whose entries are a features input's features: the last axis when its size is fixed (as before);
    when it varies (a text line's width, a dynamic sequence), the layout's channel axis if fixed, else the last fixed
    axis after the batch; None when every axis varies (the input is then one feature, its mean)."""
    shape = tuple(spec.shape)
    if len(shape) < 2 or isinstance(shape[-1], int):
        return len(shape) - 1 if shape else None
    layout = str(getattr(spec, "layout", None) or "")
    if "C" in layout and len(layout) == len(shape) and isinstance(shape[layout.index("C")], int):
        return layout.index("C")
    fixed = [i for i in range(1, len(shape)) if isinstance(shape[i], int)]
    return fixed[-1] if fixed else None


class Extractor:
    """Per-row summary values of a model's feeds and outputs (one instance per model; cheap calls).

    ``inputs`` / ``outputs``: the model's TensorSpecs; ``decoder``: the manifest's DecoderSpec;
    ``state_inputs``: names fed by a stream (left out)."""

    def __init__(self, inputs: Sequence[Any], outputs: Sequence[Any], decoder: Any, state_inputs: Iterable[str] = ()) -> None:
        state = set(state_inputs)
        self._images: list[tuple[str, Any, np.ndarray, np.ndarray, tuple[str, ...], bool, float]] = []
        self._features: list[tuple[str, int, int | None]] = []  # (name, rank, feature axis or None: one feature)
        for s in inputs:
            if s.name in state or not str(s.dtype).startswith(("float", "uint8", "int8")):
                continue
            pre = s.preprocess
            if pre is not None and s.layout in ("NCHW", "NHWC"):
                chans = ("Y",) if pre.color == "GRAY" else tuple(pre.color)
                if s.dtype.startswith("float"):
                    a = np.asarray(pre.std, np.float64) / pre.scale
                    b = np.asarray(pre.mean, np.float64) / pre.scale
                else:  # uint8: pixels as they are; int8: pixel - 128
                    a = np.ones(len(chans))
                    b = np.full(len(chans), 128.0 if s.dtype == "int8" else 0.0)
                self._images.append((s.name, s.layout, a, b, chans, s.layout == "NCHW", 1.0))
            elif s.dtype.startswith("float"):
                self._features.append((s.name, s.rank, _feature_axis(s)))
        kind = getattr(decoder, "kind", "raw")
        self.output_kind = kind if kind in ("classification", "detection") else "raw"
        self._cls_output = (decoder.output or outputs[0].name) if self.output_kind == "classification" else None
        self._softmax = bool(getattr(decoder, "softmax", True))
        self._raw_outputs = [o.name for o in outputs] if self.output_kind == "raw" else []
        self._input_hw = None
        for s in inputs:
            if s.preprocess is not None:
                self._input_hw = s.preprocess.size_hw

    @classmethod
    def for_model(cls, model: Any) -> "Extractor":
        """The extractor for a loaded ``Model`` (its variant's tensor specs, the manifest's decoder and state pairs)."""
        return cls(model.inputs, model.outputs, model.manifest.decoder, (p.input for p in model.manifest.state))

    def describe_inputs(self) -> dict[str, dict[str, Any]]:
        """Input name -> its kind ("image": layout, channels; "features": rank) for the inputs that have summaries."""
        out: dict[str, dict[str, Any]] = {}
        for name, layout, _a, _b, chans, *_rest in self._images:
            out[name] = {"kind": "image", "layout": layout, "channels": list(chans)}
        for name, rank, ax in self._features:
            out[name] = {"kind": "features", "rank": rank}
            if rank >= 2 and ax != rank - 1:
                out[name]["feature_axis"] = ax
        return out

    def inputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Summary name -> one float64 value per batch row."""
        out: dict[str, np.ndarray] = {}
        for name, _layout, a, b, chans, nchw, _ in self._images:
            x = feeds[name]
            hw = x.shape[2:4] if nchw else x.shape[1:3]
            st = max(1, min(hw) // IMAGE_SIDE)  # a strided grid of about IMAGE_SIDE^2 pixels: cost bounded by design
            if st > 1:
                x = np.ascontiguousarray(x[:, :, ::st, ::st] if nchw else x[:, ::st, ::st, :])
            n = x.shape[0]
            xf = x.reshape(n, x.shape[1], -1) if nchw else x.reshape(n, -1, x.shape[-1])  # [n, C, HW] or [n, HW, C]
            cax = 1 if nchw else 2
            cm = xf.mean(axis=2 if nchw else 1, dtype=np.float64) * a + b  # per-channel mean, pixels
            if len(chans) == 1:
                luma = xf[:, 0, :] if nchw else xf[:, :, 0]
                la, lb = a[0], b[0]
            else:
                w = np.array([_LUMA[c] for c in chans]) * a
                luma = np.tensordot(xf, w.astype(np.float32), axes=([cax], [0]))  # [n, HW], in scaled units
                la, lb = 1.0, float(np.dot([_LUMA[c] for c in chans], b))
            luma = luma.reshape(n, *(x.shape[2:4] if nchw else x.shape[1:3]))
            out[f"{name}.brightness"] = luma.mean(axis=(1, 2), dtype=np.float64) * la + lb
            out[f"{name}.contrast"] = luma.std(axis=(1, 2), dtype=np.float64) * abs(la)
            dx = np.abs(np.diff(luma, axis=2)).mean(axis=(1, 2), dtype=np.float64)
            dy = np.abs(np.diff(luma, axis=1)).mean(axis=(1, 2), dtype=np.float64)
            out[f"{name}.sharpness"] = (dx + dy) * abs(la)
            for i, c in enumerate(chans):
                out[f"{name}.mean_{c}"] = cm[:, i]
        for name, rank, ax in self._features:
            x = feeds[name]
            n = x.shape[0]
            if rank <= 1 or ax is None:
                m = x.reshape(n, -1).mean(axis=1, dtype=np.float64)[:, None]
            else:
                xf = np.moveaxis(x, ax, -1)
                m = xf.reshape(n, -1, xf.shape[-1]).mean(axis=1, dtype=np.float64)  # [n, F]: window mean per feature
            for i in range(min(m.shape[1], MAX_FEATURES)):
                out[f"{name}.f{i}"] = m[:, i]
        return out

    def outputs(self, outputs: Mapping[str, np.ndarray], decoded: Any) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """(summary name -> one value per row, top-1 class per row or None)."""
        if self._cls_output is not None:
            # from the logits, not the decoded scores: a variant's fitted temperature (docs/package-format.md)
            # would make its confidences incomparable with the reference's
            z = np.asarray(outputs[self._cls_output], np.float64)
            z = z.reshape(z.shape[0], -1)
            if self._softmax:
                e = np.exp(z - z.max(axis=1, keepdims=True))
                p = e / e.sum(axis=1, keepdims=True)
            else:
                p = z
            return {"confidence": p.max(axis=1)}, p.argmax(axis=1)
        if self.output_kind == "detection":
            dets = decoded if isinstance(decoded, (list, tuple)) else [decoded]
            hw = self._input_hw or (1, 1)
            counts, areas = [], []
            for d in dets:
                if d is None:
                    continue
                xy = np.asarray(d.xyxy, np.float64)
                counts.append(float(len(xy)))
                areas.append(float(((xy[:, 2] - xy[:, 0]) * (xy[:, 3] - xy[:, 1])).mean() / (hw[0] * hw[1])) if len(xy) else np.nan)
            return {"count": np.array(counts), "box_area": np.array(areas)}, None
        out = {}
        for name in self._raw_outputs:
            y = np.asarray(outputs[name])
            if y.dtype.kind in "fiu" and y.ndim >= 1 and y.shape[0] >= 1:
                out[f"{name}.mean"] = y.reshape(y.shape[0], -1).mean(axis=1, dtype=np.float64)
        return out, None


# ------------------------------------------------------------------------------------------------
# building reference stats


class ReferenceBuilder:
    """Collects summaries over reference data, then :meth:`build` makes the :class:`ReferenceStats`.

    ``add(feeds, outputs, decoded)`` per call (or :func:`reference_from_model`)."""

    def __init__(self, extractor: Extractor, *, labels: Sequence[str] = (), low_confidence: float = LOW_CONFIDENCE) -> None:
        self.ex = extractor
        self.labels = tuple(labels)
        self.low_confidence = low_confidence
        self._values: dict[str, list[np.ndarray]] = {}
        self._classes: list[np.ndarray] = []
        self._feeds: dict[str, list[Any]] = {}  # per input: running per-channel/feature sums
        self.rows = 0

    def add(self, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], decoded: Any = None) -> None:
        """Summarise one call: its validated feeds, raw outputs and decoded result."""
        vals = self.ex.inputs(feeds)
        ov, cls = self.ex.outputs(outputs, decoded)
        vals.update(ov)
        for k, v in vals.items():
            self._values.setdefault(k, []).append(np.asarray(v, np.float64).ravel())
        if cls is not None:
            self._classes.append(cls)
        for name, info in self.ex.describe_inputs().items():
            x = np.asarray(feeds[name], np.float64)
            if info["kind"] == "image":
                _, _layout, a, b, chans, nchw, _ = next(t for t in self.ex._images if t[0] == name)
                px = np.moveaxis(x, 1 if nchw else x.ndim - 1, -1).reshape(-1, len(chans)) * a + b
                fin = np.ones_like(px, bool)
            else:
                ax = next(t[2] for t in self.ex._features if t[0] == name)
                if x.ndim >= 2 and ax is not None:
                    xf = np.moveaxis(x, ax, -1)  # the feature axis is fixed in size; the others (a varying width) are pooled
                    px = xf.reshape(-1, xf.shape[-1])
                else:
                    px = x.reshape(-1, 1)
                fin = np.isfinite(px)
            acc = self._feeds.setdefault(name, [0.0, 0.0, np.inf, -np.inf, 0, 0])  # sum, sumsq, min, max, finite, total
            z = np.where(fin, px, 0.0)
            acc[0] = acc[0] + z.sum(axis=0)
            acc[1] = acc[1] + (z * z).sum(axis=0)
            acc[2] = np.minimum(acc[2], np.where(fin, px, np.inf).min(axis=0))
            acc[3] = np.maximum(acc[3], np.where(fin, px, -np.inf).max(axis=0))
            acc[4] = acc[4] + fin.sum(axis=0)
            acc[5] = acc[5] + px.shape[0]
        self.rows += next(iter(feeds.values())).shape[0]

    def observe(self, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], decoded: Any = None) -> None:
        """What ``Model`` calls on an attached monitor: :meth:`add`."""
        self.add(feeds, outputs, decoded)

    def schema_violation(self, exc: BaseException) -> None:
        """Inputs refused by validation are not reference data: ignored."""

    def build(self, source: str = "", n_classes: int | None = None) -> ReferenceStats:
        """The :class:`ReferenceStats` of everything added (``n_classes``: the class count when some never came up)."""
        if self.rows == 0:
            raise ReferenceStatsError("reference statistics need at least one sample, got none")
        summaries = {k: Summary.of(np.concatenate(v)) for k, v in self._values.items() if np.isfinite(np.concatenate(v)).any()}
        inputs = self.ex.describe_inputs()
        for name, info in inputs.items():
            sm, sq, lo, hi, nf, tot = self._feeds[name]
            nf_ = np.maximum(nf, 1)
            mean = sm / nf_
            std = np.sqrt(np.maximum(sq / nf_ - mean * mean, 0.0))
            if info["kind"] == "image":
                info["channel_mean"] = [round(float(v), 6) for v in mean]
                info["channel_std"] = [round(float(v), 6) for v in std]
            else:
                info["features"] = [
                    {"mean": float(mean[i]), "std": float(std[i]), "min": float(lo[i]) if nf[i] else None,
                     "max": float(hi[i]) if nf[i] else None, "missing": float(1.0 - nf[i] / tot)}
                    for i in range(len(mean))
                ]  # fmt: skip
        classes: tuple[float, ...] = ()
        lcr = None
        if self.ex.output_kind == "classification" and self._classes:
            c = np.concatenate(self._classes)
            k = max(int(c.max()) + 1, n_classes or 0, len(self.labels))
            classes = tuple(float(x) for x in np.bincount(c, minlength=k) / c.size)
            conf = np.concatenate(self._values["confidence"])
            lcr = float((conf < self.low_confidence).mean())
        return ReferenceStats(
            summaries=summaries, samples=self.rows, inputs=inputs, output_kind=self.ex.output_kind, classes=classes,
            labels=self.labels, low_confidence=self.low_confidence, low_confidence_rate=lcr, source=source,
        )  # fmt: skip


def reference_from_model(model: Any, samples: Iterable[Any], *, source: str = "", low_confidence: float = LOW_CONFIDENCE) -> ReferenceStats:
    """Reference statistics of ``model`` (an ``edge_sdk`` Model, normally the fp32 reference
    variant) over ``samples`` (model-ready arrays or feeds dicts, as ``Model.predict`` takes):
    each is run through ``predict`` with a builder attached where a monitor would be, so the
    summaries come from exactly the tensors, outputs and decoded results a monitor sees."""
    b = ReferenceBuilder(Extractor.for_model(model), labels=model.manifest.labels, low_confidence=low_confidence)
    detach = model.attach_monitor(b)
    try:
        for x in samples:
            model.predict(x)
    finally:
        detach()
    return b.build(source, len(model.manifest.labels) or None)
