"""Graph normalisation: make an exported ONNX model look like what the converter's steps expect.

``edge-convert quantize`` runs :func:`normalize` on the input model before anything else; the
result is the package's fp32 reference (numerically the same model: the pipeline checks its
outputs against the input's on validation samples). Exporters differ in ways that defeat
ONNX Runtime's quantizers or the manifest, so:

- **``Constant`` nodes become initializers** (attributes ``value``, ``value_float(s)``,
  ``value_int(s)``; ONNX operator spec, ``Constant``). Paddle2ONNX, for one, feeds every weight
  through a ``Constant`` node, and ONNX Runtime's ``MatMulNBitsQuantizer`` and
  ``quantize_dynamic`` look for weights among the initializers only. A ``Constant`` whose output
  is a graph output, or that holds strings or a sparse tensor, is kept.
- **Unnamed dynamic dims get stable names**: a dim with neither ``dim_value`` nor ``dim_param``,
  a ``dim_value`` of -1 or 0 (written by some exporters for "dynamic"), or a ``dim_param`` of
  ``"?"`` or blank, on a graph input or output, becomes ``<tensor>_dim<axis>`` (the same name
  every run, so ``--dim x_dim3=32:320`` can be written down once).
- **The opset is raised** where a mode needs it (``min_opset``; per-channel QDQ needs 13, see
  :data:`converters.quantize.MIN_QDQ_OPSET`) with ``onnx.version_converter``; if the converter
  cannot, the model keeps its opset and a note says so (that mode then fails on its own).
- **Shape inference that survives incomplete symbolic shapes** (:func:`infer_shapes`, for the
  int8 pre-processing): ONNX Runtime's ``quant_pre_process`` with symbolic shape inference,
  then with ``auto_merge``, then ONNX shape inference alone, then no inference; what happened is
  recorded, never raised.

ONNX Runtime's symbolic shape inference saves ``sym_shape_infer_temp.onnx`` into the *current
working directory* when it cannot infer every shape
(``onnxruntime/tools/symbolic_shape_infer.py``, ``SymbolicShapeInference.infer_shapes``: a
relative path, no option to move or skip it). So :func:`infer_shapes` runs ``quant_pre_process``
in a child Python process whose working directory is the converter's temp work dir: the caller's
cwd is never written, and the converter's own process never changes its cwd (``convert()`` is a
library call too, and ``os.chdir`` would move every thread of the caller).

Every change is one line in :attr:`Normalized.notes`, which go into report.json / report.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConverterError

if TYPE_CHECKING:  # onnx is a converter-only dependency, imported when used
    import onnx

__all__ = ["NormalizeError", "Normalized", "infer_shapes", "normalize", "unnamed_dim_name"]


class NormalizeError(ConverterError, ValueError):
    """The model cannot be parsed as ONNX; the message names it."""


@dataclass(frozen=True)
class Normalized:
    """The normalised model (``data``, serialized ONNX) and what was changed.

    ``notes``: one line per kind of change, for the report. ``constants``: Constant nodes made
    initializers. ``renamed_dims``: ``"tensor[axis]"`` -> the new dim name. ``opset``: the
    default-domain opset of ``data``; ``opset_from``: that of the input."""

    data: bytes
    notes: tuple[str, ...] = ()
    constants: int = 0
    renamed_dims: dict[str, str] = field(default_factory=dict)
    opset: int = 0
    opset_from: int = 0

    @property
    def changed(self) -> bool:
        """True if anything was changed (the reference is then the normalised model, not the input's bytes)."""
        return bool(self.constants or self.renamed_dims or self.opset != self.opset_from)


def unnamed_dim_name(tensor: str, axis: int) -> str:
    """The name a nameless dynamic dim gets: ``<tensor>_dim<axis>``."""
    return f"{tensor}_dim{axis}"


def _opset(m: onnx.ModelProto) -> int:
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)


def _raise_opset(m: onnx.ModelProto, target: int, why: str, notes: list[str]) -> onnx.ModelProto:
    from onnx import version_converter

    cur = _opset(m)
    if not target or cur >= target:
        return m
    try:
        up = version_converter.convert_version(m, target)
    except Exception as e:  # the version converter raises plain RuntimeErrors for ops it cannot convert
        notes.append(f"opset {cur} kept: onnx.version_converter could not raise it to {target} ({why}): {str(e)[:200]}")
        return m
    notes.append(f"opset raised from {cur} to {target} with onnx.version_converter ({why})")
    return up


_CONST_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints")


def _constants_to_initializers(m: onnx.ModelProto, notes: list[str]) -> int:
    import numpy as np
    from onnx import helper, numpy_helper

    g = m.graph
    outputs = {o.name for o in g.output}
    inits = {i.name for i in g.initializer}
    keep, made, kept_why = [], 0, []
    if m.ir_version < 4:  # before IR 4 every initializer must also be a graph input: leave the graph alone
        if any(n.op_type == "Constant" for n in g.node):
            notes.append(f"Constant nodes kept: IR version {m.ir_version} < 4 lists initializers as inputs")
        return 0
    for n in g.node:
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx") or len(n.output) != 1:
            keep.append(n)
            continue
        out = n.output[0]
        attr = n.attribute[0] if len(n.attribute) == 1 else None
        if attr is None or attr.name not in _CONST_ATTRS or out in outputs or out in inits:
            why = "a graph output" if out in outputs else ("already an initializer name" if out in inits else f"attribute {attr.name if attr else '?'}")
            kept_why.append(f"{n.name or out} ({why})")
            keep.append(n)
            continue
        v = helper.get_attribute_value(attr)
        if attr.name == "value":
            t = type(v)()
            t.CopyFrom(v)
            t.name = out
        elif attr.name in ("value_float", "value_floats"):
            t = numpy_helper.from_array(np.asarray(v, np.float32), out)
        else:
            t = numpy_helper.from_array(np.asarray(v, np.int64), out)
        g.initializer.append(t)
        inits.add(out)
        made += 1
    if made:
        del g.node[:]
        g.node.extend(keep)
        notes.append(f"{made} Constant node(s) became initializers (ONNX Runtime's quantizers find weights among initializers only)")
    if kept_why:
        notes.append(f"{len(kept_why)} Constant node(s) kept: " + ", ".join(kept_why[:10]) + (" ..." if len(kept_why) > 10 else ""))
    return made


def _is_unnamed(d: Any) -> bool:
    if d.HasField("dim_value"):
        return d.dim_value <= 0
    if d.HasField("dim_param"):
        return d.dim_param.strip() in ("", "?")
    return True


def _name_dims(m: onnx.ModelProto, notes: list[str]) -> dict[str, str]:
    inits = {i.name for i in m.graph.initializer}
    renamed: dict[str, str] = {}
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.name in inits or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if _is_unnamed(d):
                was = f"dim_value {d.dim_value}" if d.HasField("dim_value") else (f"dim_param {d.dim_param!r}" if d.HasField("dim_param") else "no name")
                name = unnamed_dim_name(vi.name, axis)
                d.Clear()
                d.dim_param = name
                renamed[f"{vi.name}[{axis}]"] = name
                notes.append(f"dynamic dim {vi.name}[{axis}] ({was}) named {name}")
    return renamed


def normalize(data: bytes, *, min_opset: int = 0, why_opset: str = "", source: str = "model") -> Normalized:
    """Normalise serialized ONNX ``data`` (see the module docstring). ``min_opset``: raise the
    default-domain opset to at least this (0: leave it), ``why_opset`` says which mode needs it.
    Raises :class:`NormalizeError` when ``data`` is not a loadable ONNX model."""
    import onnx

    try:
        m = onnx.load_from_string(data)
    except Exception as e:  # protobuf's DecodeError and friends
        raise NormalizeError(f"{source}: not a loadable ONNX model: {str(e)[:200]}") from e
    notes: list[str] = []
    frm = _opset(m)
    m = _raise_opset(m, min_opset, why_opset or f"opset >= {min_opset} needed", notes)
    n_const = _constants_to_initializers(m, notes)
    renamed = _name_dims(m, notes)
    opset = _opset(m)
    if not (n_const or renamed or opset != frm):
        return Normalized(data, tuple(notes), 0, {}, opset, frm)
    return Normalized(m.SerializeToString(), tuple(notes), n_const, renamed, opset, frm)


# --------------------------------------------------------------------------- shape inference

_CHILD = r"""
import json, sys
from onnxruntime.quantization.shape_inference import quant_pre_process
src, dst = sys.argv[1], sys.argv[2]
tries = [("symbolic shape inference", dict(skip_symbolic_shape=False)),
         ("symbolic shape inference with auto_merge", dict(skip_symbolic_shape=False, auto_merge=True)),
         ("ONNX shape inference", dict(skip_symbolic_shape=True))]
failed = []
for what, kw in tries:
    try:
        quant_pre_process(src, dst, **kw)
    except Exception as e:
        failed.append([what, (type(e).__name__ + ": " + str(e))[:200]])
        continue
    print(json.dumps({"ok": what, "failed": failed}))
    break
else:
    print(json.dumps({"ok": None, "failed": failed}))
"""


def infer_shapes(src: Path, dst: Path, work_dir: Path, *, timeout_s: float = 600.0) -> tuple[Path, str]:
    """ONNX Runtime's quantization pre-processing (shape inference + graph optimisation) of
    ``src`` into ``dst``, in a child process whose cwd is ``work_dir`` (see the module docstring).
    Tries symbolic shape inference, then with ``auto_merge``, then ONNX shape inference alone;
    when all fail, ``src`` itself is returned. Returns (the model to quantize, a note saying what
    happened). Never raises for a model that defeats inference."""
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run(
            [sys.executable, "-c", _CHILD, str(Path(src).resolve()), str(Path(dst).resolve())],
            cwd=work_dir, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return src, f"shape inference not run ({type(e).__name__}: {str(e)[:150]}); the model is quantized without it"
    res: dict[str, Any] | None = None
    for line in reversed(p.stdout.splitlines()):
        try:
            res = json.loads(line)
            break
        except ValueError:
            continue
    if p.returncode != 0 or res is None:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return src, f"shape inference failed (pre-processing exited {p.returncode}: {tail}); the model is quantized without it"
    failed = "; ".join(f"{w} failed ({e})" for w, e in res["failed"])
    if res["ok"] is None or not Path(dst).is_file():
        return src, f"shape inference: {failed}; the model is quantized without inferred shapes"
    if res["ok"] == "symbolic shape inference":
        return Path(dst), "shape inference: ONNX Runtime's symbolic shape inference and graph optimisation (quant_pre_process)"
    return Path(dst), f"shape inference: {failed}; {res['ok']} used (quant_pre_process)"
