"""Calibration and validation data for ``edge-convert quantize --calibration DATA``
and ``edge-convert validate --data DATA``.

:func:`load_data` turns a folder of images, a video, an ``.npy``/``.npz`` file
or a CSV of sensor readings into a :class:`DataSet`: one feeds dict per model
call, every array with batch dim 1 and exactly the declared dtype and shape,
checked with edge_sdk's own input rules (:class:`edge_sdk.validation.InputValidator`:
dtype exact, rank, fixed dims, dynamic dims within bounds, finite floats).
Images and video frames go through the package's own preprocessing
(:func:`edge_sdk.processing.image.preprocess_image`), so calibration sees
exactly what the model sees at run time.

Example::

    data = load_data("val_images/", manifest.inputs, limit=256)
    calib, held_out = data.split(0.25)
    quantize_static(src, dst, calib.reader(), ...)

Every problem is a :class:`CalibrationError` whose message names the file
(and the sample index or CSV line) and says what was expected and what was found.
Pickles are never loaded (``np.load(..., allow_pickle=False)``).
"""

from __future__ import annotations

import csv
import random
import sys
import tokenize
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from edge_sdk.errors import ImageError, InputError
from edge_sdk.package import PICKLE_SUFFIXES, TensorSpec
from edge_sdk.validation import InputValidator

from .errors import ConverterError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm")
LABELS_CSV = "labels.csv"
_ACCEPTED = "a folder of images (" + ", ".join(IMAGE_SUFFIXES) + "), a video (" + ", ".join(VIDEO_SUFFIXES) + "), .npy, .npz or .csv"


class CalibrationError(ConverterError, ValueError):
    """Calibration/validation data cannot be read or does not fit the model's
    inputs. The message names the file (and sample index or CSV line) and says
    what was expected and what was found."""


# --------------------------------------------------------------------------
# the data set


@dataclass(frozen=True)
class DataSet:
    """Samples for calibration or validation, one model call each.

    ``inputs``: the model's input names, in declaration order.
    ``samples``: one feeds dict (input name -> array) per call; every array is
    C-contiguous with batch dim 1 and the input's declared dtype and shape
    (dynamic dims: a value within the declared bounds). Image/video tensors are
    already preprocessed (resized, normalised, in the input's NCHW/NHWC layout).
    ``sources``: where each sample came from, e.g. ``"img/cat.png"``,
    ``"clip.mp4#frame=30"`` (0-based frame index), ``"x.npy[12]"`` (0-based
    sample index), ``"log.csv[rows 0:128]"`` (0-based data rows, header excluded,
    end exclusive).
    ``labels``: class index per sample when known (image class subfolders, an
    image folder's ``labels.csv``, or an ``.npz`` ``labels`` array), else None.
    ``class_names``: the class name of each label index when the labels came from
    names (class subfolders or named labels in ``labels.csv``), else None.
    """

    inputs: tuple[str, ...]
    samples: tuple[dict[str, np.ndarray], ...]
    sources: tuple[str, ...]
    labels: tuple[int, ...] | None = None
    class_names: tuple[str, ...] | None = None
    #: what the loader assumed in reading the data (e.g. that an input's leading dim is not a batch axis)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.samples):
            raise ValueError(f"DataSet: {len(self.samples)} samples but {len(self.sources)} sources")
        if self.labels is not None and len(self.labels) != len(self.samples):
            raise ValueError(f"DataSet: {len(self.samples)} samples but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.samples)

    def reader(self) -> Any:
        """A fresh ``onnxruntime.quantization.CalibrationDataReader`` over the samples:
        ``get_next()`` returns each feeds dict in order, then None. Each call
        returns a new reader starting at the first sample."""
        from onnxruntime.quantization import CalibrationDataReader

        samples = self.samples

        class _Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self._i = 0

            def get_next(self) -> dict[str, np.ndarray] | None:
                if self._i >= len(samples):
                    return None
                self._i += 1
                return dict(samples[self._i - 1])  # a new dict: the data set's own stays untouched

            def __len__(self) -> int:
                return len(samples)

        return _Reader()

    def split(self, holdout: float, seed: int = 0) -> tuple["DataSet", "DataSet"]:
        """``(kept, held_out)``: a deterministic shuffle (``seed``) puts
        ``round(len * holdout)`` samples (at least 1, at most ``len - 1``) in
        ``held_out`` and the rest in ``kept``; each part keeps the original order,
        and labels stay aligned. Raises CalibrationError for fewer than 2 samples
        or ``holdout`` outside (0, 1)."""
        n = len(self)
        if not 0.0 < holdout < 1.0:
            raise CalibrationError(f"split: holdout must be a fraction in (0, 1), got {holdout}")
        if n < 2:
            raise CalibrationError(f"split: need at least 2 samples to hold some out, the data set has {n}")
        k = min(n - 1, max(1, round(n * holdout)))
        perm = np.random.default_rng(seed).permutation(n)
        held = sorted(int(i) for i in perm[:k])
        kept = sorted(int(i) for i in perm[k:])
        return self._subset(kept), self._subset(held)

    def _subset(self, idx: Sequence[int]) -> "DataSet":
        return DataSet(
            inputs=self.inputs,
            samples=tuple(self.samples[i] for i in idx),
            sources=tuple(self.sources[i] for i in idx),
            labels=None if self.labels is None else tuple(self.labels[i] for i in idx),
            class_names=self.class_names,
            notes=self.notes,
        )


# --------------------------------------------------------------------------
# entry point


def load_data(
    source: str | Path,
    specs: Sequence[TensorSpec],
    *,
    limit: int | None = None,
    video_every: int = 10,
    csv_hop: int | None = None,
    progress: bool = True,
    seed: int = 0,
) -> DataSet:
    """Read calibration/validation data for a model whose inputs are ``specs``.

    ``source`` is one of:

    - a folder of images (png/jpg/jpeg/bmp/webp, searched recursively, sorted by
      relative path; hidden files and folders are skipped): each image is read as
      RGB and preprocessed for the model's single input, which must declare image
      preprocessing. Labels come from ``labels.csv`` at the folder's top
      (rows ``file,label``, ``file`` relative to the folder, ``label`` a class
      index or a class name; an optional ``file,label`` header) or else from class
      subfolders (``folder/<class>/.../x.png``, every image in one, at least two
      classes; labels index the sorted class names).
    - ``.npy``: one array for a single-input model, ``[N, *sample]`` where
      ``sample`` has the input's rank (batch dim included, so ``[N, 1, 3, H, W]``),
      or ``[N, ...]`` with the input's own rank, where axis 0 is split into N
      samples of batch 1 (so one ``[1, 3, H, W]`` array is one sample). For an
      input whose dim 0 is a fixed value other than 1 (no batch axis), an array of
      the input's rank is one sample.
    - ``.npz``: one array per input name (same rules as ``.npy``, same N for all)
      and optionally ``labels``, an integer array of N class indices. Other keys
      are an error. Or one array per *sample*, whose shapes may differ (dynamic
      dims, e.g. text lines of different widths): ``arr_0``, ``arr_1``, ... for a
      single-input model (what ``np.savez(f, *samples)`` writes), or
      ``<input>/<i>``; taken in numeric order; each array
      has the input's rank (batch 1) or one less (a batch axis is added).
    - a video (.mp4/.avi/.mkv/.mov/.webm): frames 0, ``video_every``,
      ``2 * video_every``, ... decoded with OpenCV (BGR) and preprocessed like
      images.
    - ``.csv``: sensor readings, one row per time step and one numeric column per
      channel, with an optional header row of names (detected: a first row with
      no numeric cell). The input must be rank 3: ``[batch, T, C]`` for layout
      NLC, ``[batch, C, T]`` for NCL; a rank-3 input with no layout is taken as
      NLC. Samples are windows of T rows every ``csv_hop`` rows (default
      ``T // 2``); rows after the last full window are not used. A dynamic T takes
      its upper bound, or all rows when fewer (but at least the lower bound).
      Float inputs get the values as float of that width; integer inputs accept
      only integral values within the dtype's range.

    ``limit`` caps the number of samples: ``limit`` evenly spaced ones, chosen
    before anything is decoded; ``seed`` 0 starts the spacing at the first
    candidate, another seed shifts it by a seed-determined offset (the choice is
    deterministic for a given seed). ``progress`` shows a tqdm bar on stderr
    while reading (when tqdm is installed).

    Raises CalibrationError for a missing path, a pickle, an unknown kind of file,
    zero samples, unreadable files, and any sample that breaks the input specs.
    """
    specs = tuple(specs)
    if not specs:
        raise CalibrationError("load_data: the model declares no inputs")
    if limit is not None and limit < 1:
        raise CalibrationError(f"limit must be >= 1, got {limit}")
    if video_every < 1:
        raise CalibrationError(f"video_every must be >= 1, got {video_every}")
    if csv_hop is not None and csv_hop < 1:
        raise CalibrationError(f"csv_hop must be >= 1, got {csv_hop}")
    path = Path(source)
    ctx = _Ctx(specs, limit, progress, seed)
    if not path.exists():
        raise CalibrationError(f"{path}: no such file or folder; expected {_ACCEPTED}")
    if path.is_dir():
        return _load_image_folder(path, ctx)
    suffix = path.suffix.lower()
    if path.name.lower().endswith(PICKLE_SUFFIXES):
        raise CalibrationError(f"{path}: pickle files are not accepted (loading one runs code); save arrays with numpy.save/savez instead")
    if suffix == ".npy":
        return _load_npy(path, ctx)
    if suffix == ".npz":
        return _load_npz(path, ctx)
    if suffix == ".csv":
        return _load_csv(path, ctx, csv_hop)
    if suffix in VIDEO_SUFFIXES:
        return _load_video(path, ctx, video_every)
    if suffix in IMAGE_SUFFIXES:
        raise CalibrationError(f"{path}: a single image; pass the folder that holds the images")
    raise CalibrationError(f"{path}: unknown kind of data {suffix or '(no suffix)'!r}; expected {_ACCEPTED}")


# --------------------------------------------------------------------------
# shared helpers


class _Ctx:
    def __init__(self, specs: tuple[TensorSpec, ...], limit: int | None, progress: bool, seed: int) -> None:
        self.specs = specs
        self.names = tuple(s.name for s in specs)
        self.limit = limit
        self.progress = progress
        self.seed = seed
        self.validator = InputValidator(specs)
        self.notes: list[str] = []

    def pick(self, n: int) -> list[int]:
        """Indices of the samples to keep out of ``n`` candidates (see ``limit``)."""
        if self.limit is None or self.limit >= n:
            return list(range(n))
        k = self.limit
        phase = 0 if self.seed == 0 else random.Random(self.seed).randrange(n)
        # floor((i * n + phase) / k): strictly increasing (n / k >= 1) and < n for phase < n
        return [(i * n + phase) // k for i in range(k)]

    def check(self, feeds: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
        try:
            return self.validator(feeds)
        except InputError as e:
            raise CalibrationError(f"{where}: {e}") from e

    def bar(self, items: Iterable[Any], total: int | None, desc: str) -> Iterator[Any]:
        return _progress(items, total, desc, self.progress)

    def dataset(self, samples: list[dict[str, np.ndarray]], sources: list[str], where: str, **kw: Any) -> DataSet:
        if not samples:
            raise CalibrationError(f"{where}: no samples")
        return DataSet(inputs=self.names, samples=tuple(samples), sources=tuple(sources), notes=tuple(self.notes), **kw)


def _progress(items: Iterable[Any], total: int | None, desc: str, enabled: bool) -> Iterator[Any]:
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return iter(tqdm(items, total=total, desc=desc, unit="sample", file=sys.stderr, leave=False))
    return iter(items)


def _shape_text(spec: TensorSpec) -> str:
    parts = []
    for d in spec.shape:
        if isinstance(d, int):
            parts.append(str(d))
        else:
            lo, hi = spec.bounds(d) or (1, 2**31 - 1)
            parts.append(f"{d}:{lo}..{hi}")
    return "[" + ", ".join(parts) + "]"


def _image_spec(ctx: _Ctx, where: str) -> TensorSpec:
    """The one input images are preprocessed for."""
    with_pre = [s for s in ctx.specs if s.preprocess is not None]
    if not with_pre:
        names = ", ".join(repr(s.name) for s in ctx.specs)
        raise CalibrationError(
            f"{where}: images need the model input's image preprocessing, but input {names} has no preprocessing declared; "
            "give --preprocess (size, resize, colour, scale, mean, std) or pass the tensors as .npy"
        )
    if len(ctx.specs) != 1:
        raise CalibrationError(
            f"{where}: images can feed a single-input model; this one takes {list(ctx.names)}: pass one .npz with an array per input"
        )
    return with_pre[0]


def _single_spec(ctx: _Ctx, where: str, kind: str, alternative: str) -> TensorSpec:
    if len(ctx.specs) != 1:
        raise CalibrationError(f"{where}: {kind} can feed a single-input model; this one takes {list(ctx.names)}: {alternative}")
    return ctx.specs[0]


# --------------------------------------------------------------------------
# images


def _is_hidden(rel: Path) -> bool:
    return any(p.startswith(".") for p in rel.parts)


def _load_image_folder(folder: Path, ctx: _Ctx) -> DataSet:
    from edge_sdk.processing.image import load_image, preprocess_image

    rels = sorted(
        (p.relative_to(folder) for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()),
        key=lambda r: r.as_posix(),
    )
    rels = [r for r in rels if not _is_hidden(r)]
    if not rels:
        n_files = sum(1 for p in folder.rglob("*") if p.is_file())
        raise CalibrationError(f"{folder}: no images found ({n_files} file(s) in the folder, none ending in {', '.join(IMAGE_SUFFIXES)})")
    spec = _image_spec(ctx, str(folder))
    labels, class_names = _folder_labels(folder, rels)
    keep = ctx.pick(len(rels))
    samples: list[dict[str, np.ndarray]] = []
    sources: list[str] = []
    for i in ctx.bar(keep, len(keep), f"images {folder.name}"):
        rel = rels[i]
        shown = f"{folder.name}/{rel.as_posix()}"
        try:
            x, _ = preprocess_image(load_image(folder / rel), spec)
        except ImageError as e:
            raise CalibrationError(f"{shown}: {e}") from e
        samples.append(ctx.check({spec.name: x}, shown))
        sources.append(shown)
    picked = None if labels is None else tuple(labels[i] for i in keep)
    return ctx.dataset(samples, sources, str(folder), labels=picked, class_names=class_names)


def _folder_labels(folder: Path, rels: list[Path]) -> tuple[list[int] | None, tuple[str, ...] | None]:
    """Labels for every image: from ``labels.csv``, else class subfolders, else none."""
    table = folder / LABELS_CSV
    if table.is_file():
        return _labels_csv(table, [r.as_posix() for r in rels])
    if all(len(r.parts) >= 2 for r in rels):
        names = sorted({r.parts[0] for r in rels})
        if len(names) >= 2:
            index = {n: i for i, n in enumerate(names)}
            return [index[r.parts[0]] for r in rels], tuple(names)
    return None, None


def _labels_csv(table: Path, files: list[str]) -> tuple[list[int], tuple[str, ...] | None]:
    where = f"{table.parent.name}/{table.name}"
    rows: dict[str, tuple[str, int]] = {}
    try:
        with open(table, newline="", encoding="utf-8-sig") as f:
            for line, row in enumerate(csv.reader(f), start=1):
                cells = [c.strip() for c in row]
                if not any(cells):
                    continue
                if line == 1 and [c.lower() for c in cells] == ["file", "label"]:
                    continue
                if len(cells) != 2 or not cells[0] or not cells[1]:
                    raise CalibrationError(f"{where} line {line}: expected 'file,label', got {row!r}")
                if cells[0] in rows:
                    raise CalibrationError(f"{where} line {line}: {cells[0]!r} already labelled on line {rows[cells[0]][1]}")
                rows[cells[0]] = (cells[1], line)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise CalibrationError(f"{where}: cannot read it as UTF-8 CSV: {e}") from e
    unknown = sorted(set(rows) - set(files))
    if unknown:
        raise CalibrationError(
            f"{where}: {len(unknown)} row(s) name no image in the folder, first {unknown[0]!r} (line {rows[unknown[0]][1]})"
        )
    missing = [f for f in files if f not in rows]
    if missing:
        raise CalibrationError(f"{where}: {len(missing)} image(s) have no label, first {missing[0]!r}")
    values = [rows[f][0] for f in files]
    if all(v.isdigit() for v in values):
        return [int(v) for v in values], None
    names = sorted(set(values))
    index = {n: i for i, n in enumerate(names)}
    return [index[v] for v in values], tuple(names)


# --------------------------------------------------------------------------
# video


def _load_video(path: Path, ctx: _Ctx, every: int) -> DataSet:
    from edge_sdk.processing.image import _cv2, preprocess_image

    spec = _image_spec(ctx, str(path))
    cv2 = _cv2()
    name = path.name

    def open_capture() -> Any:
        cap = cv2.VideoCapture(str(path))
        if not cap.isOpened():
            cap.release()
            raise CalibrationError(f"{path}: OpenCV cannot open it as a video (expected a readable {', '.join(VIDEO_SUFFIXES)} file)")
        return cap

    def frames(cap: Any, wanted: Callable[[int], bool]) -> Iterator[tuple[int, np.ndarray]]:
        i = 0
        while cap.grab():
            if wanted(i):
                ok, frame = cap.retrieve()
                if not ok or frame is None:
                    raise CalibrationError(f"{path}: frame {i} could not be decoded")
                yield i, frame
            i += 1

    cap = open_capture()
    try:
        if ctx.limit is not None:
            # count first, so the limit picks evenly over the whole video
            n_frames = 0
            while cap.grab():
                n_frames += 1
            cap.release()
            candidates = list(range(0, n_frames, every))
            keep = {candidates[j] for j in ctx.pick(len(candidates))}
            cap = open_capture()
            total: int | None = len(keep)
        else:
            est = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
            keep = None
            total = (est + every - 1) // every if est > 0 else None
        wanted = (lambda i: i % every == 0) if keep is None else (lambda i: i in keep)
        samples: list[dict[str, np.ndarray]] = []
        sources: list[str] = []
        for i, frame in ctx.bar(frames(cap, wanted), total, f"video {name}"):
            shown = f"{name}#frame={i}"
            try:
                x, _ = preprocess_image(frame, spec, color="BGR")
            except ImageError as e:
                raise CalibrationError(f"{path}#frame={i}: {e}") from e
            samples.append(ctx.check({spec.name: x}, shown))
            sources.append(shown)
    finally:
        cap.release()
    if not samples:
        raise CalibrationError(f"{path}: OpenCV opened it but decoded no frames; expected a video with at least one frame")
    return ctx.dataset(samples, sources, str(path))


# --------------------------------------------------------------------------
# numpy files


def _check_dtype(arr: np.ndarray, spec: TensorSpec, where: str) -> None:
    if arr.dtype != np.dtype(spec.dtype):
        raise CalibrationError(
            f"{where}: input {spec.name!r} expects dtype {spec.dtype}, the file holds {arr.dtype} "
            f"(nothing is cast silently; save it with .astype(np.{spec.dtype}))"
        )


#: Dim names that say "batch" (case-insensitive): ``batch``, ``batch_size``, ``N``, ``bs``, ``b``, anything with "batch".
_BATCH_NAMES = ("n", "b", "bs", "nb", "num", "count")
#: Name parts that say a dim is not a batch (sequence and time axes, spatial axes, channels).
_NOT_BATCH_PARTS = ("seq", "len", "time", "frame", "sample", "step", "token", "width", "height", "chan", "feat", "window")


def batch_axis(spec: TensorSpec) -> tuple[bool | None, str]:
    """Whether the input's leading dim is a batch axis, and why: True for a fixed 1, a name that says batch
    (``batch``, ``batch_size``, ``N``, ...) or bounds that start at 1 (a batch can be one); False for a fixed size other
    than 1, a name that says sequence/time/space (``seq_len``, ``samples``, ``width``, ...) or bounds that start above 1
    (``seq_len`` 31..31 is 31 steps, not a batch of 31); None when nothing says (a nameless dim without --dim)."""
    if not spec.rank:
        return False, "a scalar input"
    d0 = spec.shape[0]
    if isinstance(d0, int):
        return (d0 == 1), f"dim 0 is fixed at {d0}"
    low = d0.lower()
    if "batch" in low or low in _BATCH_NAMES:
        return True, f"dim 0 is named {d0!r}"
    if any(part in low for part in _NOT_BATCH_PARTS):
        return False, f"dim 0 is named {d0!r}, not a batch name"
    b = spec.bounds(d0)
    if b is not None and b[1] < (1 << 24):  # bounds given (not the open ones read off the data)
        return (b[0] == 1), f"dim 0 ({d0}) is bounded {b[0]}..{b[1]}"
    return None, f"dim 0 ({d0}) has neither a batch name nor bounds"


def _sample_view(arr: np.ndarray, spec: TensorSpec, where: str, notes: list[str] | None = None) -> tuple[int, Callable[[int], np.ndarray]]:
    """(number of samples, i -> sample i with the input's rank, as a C-contiguous copy:
    nothing keeps the memory map or the whole array alive).

    An array of the input's rank + 1 is ``[N, *sample]``. Its samples must have batch 1 only when the input's leading
    dim is a batch axis (:func:`batch_axis`); otherwise (``[seq_len, 576]``) each ``arr[i]`` is one whole sample. An
    array of the input's rank is split along axis 0 into samples of batch 1 when that dim is (or may be) a batch, and is
    one sample when it is not. What was assumed goes into ``notes``."""
    rank = spec.rank
    is_batch, why = batch_axis(spec)
    if arr.ndim == rank + 1:
        if rank and is_batch and arr.shape[1] != 1:
            raise CalibrationError(
                f"{where}: array of shape {arr.shape} read as [N, *sample] holds samples of batch {arr.shape[1]}; "
                f"expected batch 1 ([N, 1, ...]) for input {spec.name!r} {_shape_text(spec)} ({why}: a batch axis), or pass it as [N, ...]"
            )
        if rank and not is_batch and notes is not None and arr.shape[1] != 1:
            notes.append(
                f"{where}: array {list(arr.shape)} read as {arr.shape[0]} samples of shape {list(arr.shape[1:])} for input {spec.name!r} "
                f"{_shape_text(spec)}: {why}, so it is {'not ' if is_batch is False else 'taken as not '}a batch axis"
            )
        return arr.shape[0], lambda i: np.array(arr[i], order="C", copy=True)
    if arr.ndim == rank:
        d0 = spec.shape[0] if rank else None
        if rank and is_batch is not False and (isinstance(d0, str) or d0 == 1):
            return arr.shape[0], lambda i: np.array(arr[i : i + 1], order="C", copy=True)
        if rank and is_batch is False and isinstance(d0, str) and notes is not None:
            notes.append(f"{where}: array {list(arr.shape)} read as one sample for input {spec.name!r} {_shape_text(spec)}: {why}, so it is not a batch axis")
        return 1, lambda i: np.array(arr, order="C", copy=True)
    raise CalibrationError(
        f"{where}: array of shape {arr.shape} does not fit input {spec.name!r} {_shape_text(spec)}: "
        f"expected rank {rank} (samples along the batch axis) or rank {rank + 1} ([N, *sample])"
    )


def _np_load(path: Path, **kw: Any) -> Any:
    try:
        return np.load(path, allow_pickle=False, **kw)
    except ValueError as e:
        if "pickle" in str(e).lower() or "python objects" in str(e).lower():
            raise CalibrationError(f"{path}: holds pickled Python objects; only plain numeric arrays are accepted") from e
        raise CalibrationError(f"{path}: not a readable numpy file: {e}") from e
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, SyntaxError, tokenize.TokenError) as e:
        # SyntaxError / TokenError: numpy parses the .npy header dict with the tokenizer
        raise CalibrationError(f"{path}: not a readable numpy file (.npy array or .npz zip of arrays): {e}") from e


def _load_npy(path: Path, ctx: _Ctx) -> DataSet:
    spec = _single_spec(ctx, str(path), ".npy", "pass one .npz with an array per input")
    arr = _np_load(path, mmap_mode="r")
    if not isinstance(arr, np.ndarray):
        raise CalibrationError(f"{path}: expected one array (.npy), found {type(arr).__name__}")
    _check_dtype(arr, spec, str(path))
    n, get = _sample_view(arr, spec, str(path), ctx.notes)
    if n == 0:
        raise CalibrationError(f"{path}: array of shape {arr.shape} holds no samples")
    keep = ctx.pick(n)
    samples, sources = [], []
    for i in ctx.bar(keep, len(keep), f"npy {path.name}"):
        shown = f"{path.name}[{i}]"
        samples.append(ctx.check({spec.name: get(i)}, f"{path}[{i}] (sample {i} of {n} in an array of shape {arr.shape})"))
        sources.append(shown)
    del arr  # close the memory map; every sample is a copy
    return ctx.dataset(samples, sources, str(path))


def _load_npz(path: Path, ctx: _Ctx) -> DataSet:
    z = _np_load(path)
    if not hasattr(z, "files"):
        raise CalibrationError(f"{path}: expected an .npz archive of named arrays, found a single array")
    with z:
        keys = list(z.files)
        missing = [n for n in ctx.names if n not in keys]
        if missing and _per_sample_keys(keys, ctx) is not None:
            return _load_npz_per_sample(path, z, keys, ctx)
        if missing:
            raise CalibrationError(f"{path}: no array for input(s) {missing}; the file holds {keys}, the model takes {list(ctx.names)}")
        extra = [k for k in keys if k not in ctx.names and k != "labels"]
        if extra:
            raise CalibrationError(f"{path}: unexpected array(s) {extra}; expected one per input {list(ctx.names)} and optionally 'labels'")
        try:
            arrays = {s.name: z[s.name] for s in ctx.specs}
            raw_labels = z["labels"] if "labels" in keys else None
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, SyntaxError, tokenize.TokenError) as e:
            raise CalibrationError(f"{path}: cannot read its arrays (expected intact .npy members in a zip): {e}") from e
    views = {}
    counts = {}
    for s in ctx.specs:
        where = f"{path}['{s.name}']"
        _check_dtype(arrays[s.name], s, where)
        counts[s.name], views[s.name] = _sample_view(arrays[s.name], s, where, ctx.notes)
    if len(set(counts.values())) != 1:
        raise CalibrationError(f"{path}: inputs hold different numbers of samples {counts}; expected the same N for all")
    n = next(iter(counts.values()))
    if n == 0:
        raise CalibrationError(f"{path}: the arrays hold no samples (shapes {[a.shape for a in arrays.values()]})")
    labels = None
    if raw_labels is not None:
        if raw_labels.ndim != 1 or raw_labels.shape[0] != n or raw_labels.dtype.kind not in "iu":
            raise CalibrationError(
                f"{path}['labels']: expected {n} integer class indices (shape ({n},)), got {raw_labels.dtype} shape {raw_labels.shape}"
            )
        if n and int(raw_labels.min()) < 0:
            i = int(np.argmin(raw_labels))
            raise CalibrationError(f"{path}['labels'][{i}]: class indices must be >= 0, got {int(raw_labels[i])}")
        labels = [int(v) for v in raw_labels]
    keep = ctx.pick(n)
    samples, sources = [], []
    for i in ctx.bar(keep, len(keep), f"npz {path.name}"):
        feeds = {name: views[name](i) for name in ctx.names}
        shapes = ", ".join(f"{k} {a.shape}" for k, a in arrays.items())
        samples.append(ctx.check(feeds, f"{path}[{i}] (sample {i} of {n}; arrays {shapes})"))
        sources.append(f"{path.name}[{i}]")
    picked = None if labels is None else tuple(labels[i] for i in keep)
    return ctx.dataset(samples, sources, str(path), labels=picked)


def _natural(key: str) -> tuple[str, int]:
    head, _, tail = key.rpartition("_") if "/" not in key else key.rpartition("/")
    return (head, int(tail)) if tail.isdigit() else (key, -1)


def _per_sample_keys(keys: Sequence[str], ctx: _Ctx) -> dict[str, list[str]] | None:
    """For an .npz of one array per sample: input name -> its keys in sample order, or None if the keys are not
    that form: ``arr_0, arr_1, ...`` (what ``np.savez(f, *samples)`` writes) for a single-input model, or
    ``<input>/<i>`` for any model."""
    data = [k for k in keys if k != "labels"]
    if not data:
        return None
    if len(ctx.names) == 1 and all(k.startswith("arr_") and k[4:].isdigit() for k in data):
        return {ctx.names[0]: sorted(data, key=_natural)}
    out: dict[str, list[str]] = {n: [] for n in ctx.names}
    for k in data:
        name, _, idx = k.rpartition("/")
        if name not in out or not idx.isdigit():
            return None
        out[name].append(k)
    return {n: sorted(v, key=_natural) for n, v in out.items()}


def _load_npz_per_sample(path: Path, z: Any, keys: Sequence[str], ctx: _Ctx) -> DataSet:
    """An .npz holding one array per sample (shapes may differ between samples: dynamic dims): each array has the
    input's rank (batch dim 1 included) or one less (a batch axis of 1 is added)."""
    order = _per_sample_keys(keys, ctx)
    assert order is not None
    counts = {n: len(v) for n, v in order.items()}
    if len(set(counts.values())) != 1:
        raise CalibrationError(f"{path}: inputs hold different numbers of per-sample arrays {counts}; expected the same number for all")
    n = next(iter(counts.values()))
    raw_labels = None
    try:
        if "labels" in keys:
            raw_labels = z["labels"]
        keep = ctx.pick(n)
        samples, sources = [], []
        for i in ctx.bar(keep, len(keep), f"npz {path.name}"):
            feeds = {}
            for s in ctx.specs:
                key = order[s.name][i]
                arr = z[key]
                where = f"{path}[{key!r}]"
                _check_dtype(arr, s, where)
                if arr.ndim == s.rank - 1:
                    arr = arr[None]
                if arr.ndim != s.rank:
                    raise CalibrationError(f"{where}: array of shape {arr.shape} does not fit input {s.name!r} {_shape_text(s)}: expected one sample of rank {s.rank} (or {s.rank - 1}, without the batch axis)")
                feeds[s.name] = np.ascontiguousarray(arr)
            samples.append(ctx.check(feeds, f"{path}[{i}] (per-sample arrays {[order[s][i] for s in ctx.names]})"))
            sources.append(f"{path.name}[{order[ctx.names[0]][i]}]")
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, SyntaxError, tokenize.TokenError) as e:
        raise CalibrationError(f"{path}: cannot read its arrays (expected intact .npy members in a zip): {e}") from e
    labels = None
    if raw_labels is not None:
        if raw_labels.ndim != 1 or raw_labels.shape[0] != n or raw_labels.dtype.kind not in "iu":
            raise CalibrationError(f"{path}['labels']: expected {n} integer class indices (shape ({n},)), got {raw_labels.dtype} shape {raw_labels.shape}")
        labels = tuple(int(raw_labels[i]) for i in keep)
    return ctx.dataset(samples, sources, str(path), labels=labels)


# --------------------------------------------------------------------------
# CSV sensor windows


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_csv(path: Path) -> tuple[np.ndarray, list[str] | None, list[int]]:
    """(values float64 [rows, channels], header names or None, file line of each data row)."""
    header: list[str] | None = None
    values: list[list[float]] = []
    lines: list[int] = []
    width = 0
    blank_at: int | None = None
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            for row in reader:
                line = reader.line_num
                cells = [c.strip() for c in row]
                if not any(cells) and len(cells) <= 1:
                    blank_at = blank_at or line
                    continue
                if blank_at is not None:
                    raise CalibrationError(
                        f"{path}: line {blank_at} is empty but data follows on line {line}; expected one row per time step"
                    )
                if header is None and not values and all(c and not _is_number(c) for c in cells):
                    header, width = cells, len(cells)
                    continue
                if not width:
                    width = len(cells)
                if len(cells) != width:
                    raise CalibrationError(
                        f"{path}: line {line} (data row {len(values)}) has {len(cells)} columns, expected {width} like the first row"
                    )
                try:
                    values.append([float(c) for c in cells])
                except ValueError:
                    for col, c in enumerate(cells):
                        name = f" ({header[col]!r})" if header else ""
                        if not c:
                            raise CalibrationError(
                                f"{path}: line {line} (data row {len(values)}), column {col}{name} is empty; expected a number"
                            ) from None
                        if not _is_number(c):
                            raise CalibrationError(
                                f"{path}: line {line} (data row {len(values)}), column {col}{name}: {c!r} is not a number"
                            ) from None
                    raise
                lines.append(line)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise CalibrationError(f"{path}: cannot read it as UTF-8 CSV: {e}") from e
    arr = np.asarray(values, dtype=np.float64).reshape(len(values), width)
    if arr.size and not np.isfinite(arr).all():
        r, col = (int(v[0]) for v in np.nonzero(~np.isfinite(arr)))
        name = f" ({header[col]!r})" if header else ""
        raise CalibrationError(f"{path}: line {lines[r]} (data row {r}), column {col}{name} is {arr[r, col]}; expected a finite number")
    return arr, header, lines


def _to_dtype(vals: np.ndarray, spec: TensorSpec, path: Path, lines: list[int]) -> np.ndarray:
    dt = np.dtype(spec.dtype)
    if dt.kind == "f":
        return vals.astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        bad = (vals != np.round(vals)) | (vals < info.min) | (vals > info.max)
        if bad.any():
            r, col = (int(v[0]) for v in np.nonzero(bad))
            raise CalibrationError(
                f"{path}: line {lines[r]} (data row {r}), column {col} is {vals[r, col]}; input {spec.name!r} is {dt}, "
                f"which takes whole numbers in [{info.min}, {info.max}]"
            )
        return vals.astype(dt)
    raise CalibrationError(f"{path}: input {spec.name!r} has dtype {dt}; CSV sensor data feeds float or integer inputs")


def _load_csv(path: Path, ctx: _Ctx, hop: int | None) -> DataSet:
    spec = _single_spec(ctx, str(path), "a CSV", "pass one .npz with an array per input")
    layout = spec.layout or ("NLC" if spec.rank == 3 else None)
    if spec.rank != 3 or layout not in ("NLC", "NCL"):
        raise CalibrationError(
            f"{path}: CSV windows feed a rank-3 input [batch, T, C] (layout NLC) or [batch, C, T] (NCL); "
            f"input {spec.name!r} is {_shape_text(spec)} with layout {spec.layout}"
        )
    t_ax, c_ax = (1, 2) if layout == "NLC" else (2, 1)
    vals, header, lines = _read_csv(path)
    n_rows, n_ch = vals.shape
    if n_rows == 0:
        raise CalibrationError(f"{path}: no data rows" + (" (only a header)" if header else ""))
    # channels
    c = spec.shape[c_ax]
    if isinstance(c, int):
        if n_ch != c:
            raise CalibrationError(f"{path}: {n_ch} channel column(s), input {spec.name!r} {_shape_text(spec)} expects {c} ({layout})")
    else:
        lo, hi = spec.bounds(c) or (1, 2**31 - 1)
        if not lo <= n_ch <= hi:
            raise CalibrationError(f"{path}: {n_ch} channel column(s), input {spec.name!r} dim {c} takes {lo}..{hi}")
    # window length
    t = spec.shape[t_ax]
    if isinstance(t, int):
        win = t
        if n_rows < win:
            raise CalibrationError(f"{path}: {n_rows} data row(s), input {spec.name!r} {_shape_text(spec)} needs windows of {win} rows")
    else:
        lo, hi = spec.bounds(t) or (1, 2**31 - 1)
        if n_rows < lo:
            raise CalibrationError(f"{path}: {n_rows} data row(s), input {spec.name!r} dim {t} needs at least {lo} rows")
        win = min(hi, n_rows)
    step = hop if hop is not None else max(1, win // 2)
    data = _to_dtype(vals, spec, path, lines)
    starts = list(range(0, n_rows - win + 1, step))
    keep = ctx.pick(len(starts))
    samples, sources = [], []
    for j in ctx.bar(keep, len(keep), f"csv {path.name}"):
        s = starts[j]
        w = data[s : s + win]
        x = np.ascontiguousarray((w if layout == "NLC" else w.T)[None])
        shown = f"{path.name}[rows {s}:{s + win}]"
        samples.append(ctx.check({spec.name: x}, f"{path}[rows {s}:{s + win}] (lines {lines[s]}-{lines[s + win - 1]})"))
        sources.append(shown)
    return ctx.dataset(samples, sources, str(path))
