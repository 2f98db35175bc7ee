"""Repair an int8 (QDQ) variant that fails its quality gate by keeping its most
quantization-sensitive nodes in float.

    ranking = rank_sensitivity(fp32, qdq, samples, work_dir=tmp / "rank")
    result = repair_int8(fp32, out, quantize=q, evaluate=gate, samples=samples, work_dir=tmp)

``quantize(out_path, nodes_to_exclude)`` is the caller's own int8 recipe (for
instance ``quantize_static`` in QDQ format with ``nodes_to_exclude=...``) and
``evaluate(model_path) -> (passes, one_line_summary)`` the caller's quality gate;
this module only decides *which* nodes to leave in float.

How sensitivity is measured (:func:`rank_sensitivity`)
------------------------------------------------------
ONNX Runtime's ``onnxruntime.quantization.qdq_loss_debug`` does the heavy lifting:
the float and the QDQ model are both augmented with
``modify_model_output_intermediate_tensors`` (every float node input/output
becomes a model output), run over ``samples`` with ``collect_activations``,
and paired per activation tensor with ``create_activation_matching``.
``compute_activation_error`` then gives, per quantized activation ``T``,

* ``xmodel_err``: SQNR of the QDQ model's post-QDQ ``T`` against the float
  model's ``T`` (the error accumulated up to and including ``T``), and
* ``qdq_err``: SQNR of ``T`` just before vs. just after its own Q/DQ pair.

Neither is used as is. ``qdq_err`` is wrong wherever ORT folded an activation
into the Q/DQ pair (a ``Relu`` after a ``Conv`` is removed and its clamp done by
the quantizer, so "before QDQ" is the *pre-Relu* value), and it barely moves
when one outlier channel stretches a per-tensor scale: the tensor's norm is the
outlier's, so the crushed small channels hardly register. ``xmodel_err`` only
ever gets worse downstream, so ranking by it blames the last layers for an
error made earlier.

So each quantized node is charged with the noise it *adds*: with
``NSR = 10 ** (-SQNR / 10)`` (noise power over signal power vs. the float
model), a node's score is ``-10*log10(NSR(output) - max NSR(activation inputs
as the node reads them))``, floored at ORT's epsilon (~313 dB: "added none").
The output is taken after its Q/DQ pair, so a node pays for its own weights,
its own output quantization, and for amplifying noise that was harmless on its
inputs. For the classic outlier-channel failure (a Conv whose output has one
huge channel, feeding another layer) the *consumer* ranks first: by
whole-tensor SQNR the outlier tensor still looks fine (~35-45 dB, its norm is
the outlier's), and the collapse shows at the consumer's output. Once a node
has destroyed the signal, the scores of the nodes after it compare garbage with
garbage and are noisy; trust the top of the ranking, and rank the repaired
model again to look further.

Nodes are attributed through the QDQ graph, where ORT keeps the float node
names: each activation tensor maps to the node that produces it *there* (so a
Relu folded into its Conv is charged to that Conv, the node ``nodes_to_exclude``
can actually act on), and ``NodeSensitivity.tensor`` is the float model's name
for that activation. Only nodes that run quantized are ranked: every float
input, weights included, comes from a ``DequantizeLinear`` and every float
output feeds a ``QuantizeLinear``.

Exclusion order (:func:`repair_int8`)
-------------------------------------
In ORT's QDQ format a tensor keeps its Q/DQ pair while its producer *or any*
consumer is quantized, and every consumer then reads the ``DequantizeLinear``
output. Excluding only the consumer of a badly quantized tensor makes that
node's weights and arithmetic float, but it still reads the quantized tensor.
So nodes are excluded in ranking order, each followed at once by its "QDQ
partners" among the ranked nodes: the producer and other readers of each
quantized activation it reads, then the readers of what it writes. For the
outlier channel that is consumer, then producer: two exclusions.
"""

from __future__ import annotations

import hashlib
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # onnx is a converter-only dependency; import it lazily at run time
    import onnx

__all__ = ["NodeSensitivity", "RepairResult", "rank_sensitivity", "repair_int8"]

log = logging.getLogger(__name__)

_Q = "QuantizeLinear"
_DQ = "DequantizeLinear"
# What ORT's compute_signal_to_quantization_noice_ratio returns for zero noise
# (20*log10(1/eps)); added-noise scores are floored at the same value.
_MIN_NSR = float(np.finfo(float).eps) ** 2
_MAX_SQNR_DB = -10.0 * math.log10(_MIN_NSR)


@dataclass(frozen=True)
class NodeSensitivity:
    """How much quantization noise one quantized node adds.

    ``node``/``op_type``: the float model's node (same name in the QDQ model).
    ``tensor``: its output activation, by the float model's tensor name (for a
    Conv whose Relu ORT folded away, the Relu's output). ``sqnr_db``: SQNR of
    the noise this node adds over what its inputs already carried, vs. the
    float model on the samples (see the module docstring). Lower = worse;
    ~313 dB means it added none measurable.
    """

    node: str
    op_type: str
    tensor: str
    sqnr_db: float


@dataclass(frozen=True)
class RepairResult:
    """Outcome of :func:`repair_int8`.

    ``passed``: the model at ``out_model`` passed ``evaluate``. ``excluded``:
    the nodes left in float in that model; when nothing passed, ``out_model``
    holds the *best* attempt (highest output SQNR vs. the float model on
    ``samples``) and ``excluded`` names that attempt's exclusions. ``attempts``:
    ``(excluded nodes, evaluate's summary)`` for every quantization, in order,
    the plain int8 model first. ``ranking``: worst-first sensitivity of the
    plain int8 model (empty when it passed as is).
    """

    passed: bool
    excluded: tuple[str, ...]
    attempts: tuple[tuple[tuple[str, ...], str], ...]
    ranking: tuple[NodeSensitivity, ...]


# --------------------------------------------------------------------------- ranking


def _reader(samples: Sequence[Mapping[str, np.ndarray]]) -> Any:
    """A fresh one-pass ``CalibrationDataReader`` over in-memory feeds."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            s = next(self._it, None)
            return None if s is None else dict(s)

    return _Reader()


def _copy_model(src: Path, dst: Path) -> None:
    """Copy a model into ``work_dir``: ORT's shape inference writes a sibling
    ``*-inferred.onnx`` next to the model it loads, which must not land beside
    the caller's files. External data, if any, is inlined."""
    import onnx

    onnx.save(onnx.load(str(src)), str(dst))


class _Graph:
    """Producer/consumer/type index over one (shape-inferred) graph."""

    _FLOAT_TYPES = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.nodes = list(g.node)
        self.initializers = {t.name: t for t in g.initializer}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.nodes:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.elem_type: dict[str, int] = {}
        for vi in [*g.value_info, *g.input, *g.output]:
            if vi.type.HasField("tensor_type"):
                self.elem_type[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            self.elem_type[t.name] = t.data_type

    def is_float(self, name: str) -> bool:
        t = self.elem_type.get(name)
        return t is None or t in self._FLOAT_TYPES  # unknown: assume float (the strict answer)

    def runs_quantized(self, node: Any) -> bool:
        """Every float input comes from a DequantizeLinear (so weights are int8
        too) and every float output feeds a QuantizeLinear."""
        ins = [i for i in node.input if i and self.is_float(i)]
        if not ins:
            return False
        for i in ins:
            p = self.producer.get(i)
            if p is None or p.op_type != _DQ:
                return False
        for o in node.output:
            if o and self.is_float(o) and not any(c.op_type == _Q for c in self.consumers.get(o, [])):
                return False
        return True

    def activation_source(self, name: str) -> str | None:
        """The float-model activation behind tensor ``name`` as a node reads it:
        ``T_DequantizeLinear_Output`` -> ``T``; ``None`` for (quantized) weights."""
        from onnxruntime.quantization.quant_utils import QUANT_INPUT_SUFFIX

        p = self.producer.get(name)
        if p is not None and p.op_type == _DQ:
            q_in = p.input[0]
            if q_in in self.initializers:
                return None  # a quantized weight or bias
            qp = self.producer.get(q_in)
            if qp is None or qp.op_type != _Q:
                return None  # a DQ of something we cannot trace (pre-quantized input)
            name = qp.input[0]
        if name in self.initializers:
            return None
        return name[: -len(QUANT_INPUT_SUFFIX)] if name.endswith(QUANT_INPUT_SUFFIX) else name

    def _dq_readers(self, tensor: str) -> list[Any]:
        """Nodes that read ``tensor`` through its QuantizeLinear -> DequantizeLinear pair(s)."""
        out = []
        for q in self.consumers.get(tensor, []):
            if q.op_type != _Q:
                continue
            for dq in self.consumers.get(q.output[0], []):
                if dq.op_type == _DQ:
                    out.extend(self.consumers.get(dq.output[0], []))
        return out

    def qdq_partners(self, node: Any) -> list[str]:
        """Other nodes that keep ``node``'s activations quantized: ORT gives a
        tensor a Q/DQ pair while its producer or any consumer is quantized, and
        every consumer then reads the DequantizeLinear output. First the owners
        of the activations ``node`` reads (producer, other readers), then the
        readers of what it writes, in input/output order, no duplicates."""
        names: list[str] = []
        for i in node.input:
            p = self.producer.get(i) if i else None
            if p is None or p.op_type != _DQ or p.input[0] in self.initializers:
                continue
            q = self.producer.get(p.input[0])
            if q is None or q.op_type != _Q:
                continue
            tensor = q.input[0]
            owner = self.producer.get(tensor)
            names += ([owner.name] if owner is not None else []) + [c.name for c in self._dq_readers(tensor)]
        for o in node.output:
            if o:
                names += [c.name for c in self._dq_readers(o)]
        return [n for n in dict.fromkeys(names) if n and n != node.name]


def _nsr(sqnr_db: float) -> float:
    return 10.0 ** (-sqnr_db / 10.0)


def rank_sensitivity(
    fp32_model: Path,
    qdq_model: Path,
    samples: Sequence[dict[str, np.ndarray]],
    *,
    work_dir: Path,
) -> list[NodeSensitivity]:
    """Rank the quantized nodes of ``qdq_model`` by the quantization noise each
    adds, worst (lowest ``sqnr_db``) first; ties keep graph order.

    ``fp32_model`` must be the float model that was quantized (after any
    ``quant_pre_process``): nodes and activations are matched by name.
    ``samples`` are model feeds (a handful is enough; every activation of every
    sample is held in memory). Augmented copies of both models are written to
    ``work_dir``; the given model files are only read. Only nodes that run
    quantized (QDQ around every float input and output) are returned; see the
    module docstring for how SQNR is attributed to nodes.
    """
    import onnx
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        compute_activation_error,
        compute_signal_to_quantization_noice_ratio,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    if not samples:
        raise ValueError("rank_sensitivity: need at least one sample")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    f_copy, q_copy = work_dir / "float.onnx", work_dir / "qdq.onnx"
    f_aug, q_aug = work_dir / "float.augmented.onnx", work_dir / "qdq.augmented.onnx"
    _copy_model(Path(fp32_model), f_copy)
    _copy_model(Path(qdq_model), q_copy)
    float_ops = {n.name: n.op_type for n in onnx.load(str(f_copy), load_external_data=False).graph.node if n.name}
    qdq = _Graph(onnx.shape_inference.infer_shapes(onnx.load(str(q_copy))))
    quantized = [n for n in qdq.nodes if qdq.runs_quantized(n)]
    strangers = [n.name or f"<unnamed {n.op_type}>" for n in quantized if float_ops.get(n.name) != n.op_type]
    if strangers:
        raise ValueError(
            f"rank_sensitivity: quantized nodes {strangers[:5]} of {qdq_model} are not in {fp32_model}; "
            "pass the float model that was actually quantized (after any pre-processing)"
        )
    if not quantized:
        return []
    modify_model_output_intermediate_tensors(f_copy, f_aug)
    modify_model_output_intermediate_tensors(q_copy, q_aug)
    float_acts = collect_activations(str(f_aug), _reader(samples))
    qdq_acts = collect_activations(str(q_aug), _reader(samples))

    matching = create_activation_matching(qdq_acts, float_acts)
    matching = {name: m for name, m in matching.items() if "float" in m}  # compute_activation_error needs it
    tensor_sqnr = {name: e["xmodel_err"] for name, e in compute_activation_error(matching).items()}

    ranked: list[tuple[float, int, NodeSensitivity]] = []
    for order, node in enumerate(quantized):
        outs = [(tensor_sqnr[t], t) for t in (qdq.activation_source(o) for o in node.output if o) if t in tensor_sqnr]
        if not outs:
            log.debug("rank_sensitivity: %s has no matched output activation; not ranked", node.name)
            continue
        out_sqnr, tensor = min(outs)
        in_nsr = 0.0
        for i in node.input:
            src = qdq.activation_source(i) if i else None
            if src is None or src not in float_acts or i not in qdq_acts:
                continue
            in_nsr = max(in_nsr, _nsr(compute_signal_to_quantization_noice_ratio(float_acts[src], qdq_acts[i])))
        added = max(_nsr(out_sqnr) - in_nsr, _MIN_NSR)
        score = min(-10.0 * math.log10(added), _MAX_SQNR_DB)
        ranked.append((score, order, NodeSensitivity(node.name, node.op_type, tensor, score)))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in ranked]


# --------------------------------------------------------------------------- repair


def _output_sqnr(model: Path, reference: list[list[np.ndarray]], samples: Sequence[Mapping[str, np.ndarray]]) -> float:
    """SQNR (dB) of all of ``model``'s outputs over ``samples`` vs. ``reference``."""
    num = den = 0.0
    for ref, got in zip(reference, _run(model, samples)):
        for r, g in zip(ref, got):
            r64, g64 = np.asarray(r, np.float64), np.asarray(g, np.float64)
            num += float(np.sum(r64 * r64))
            den += float(np.sum((r64 - g64) ** 2))
    if den <= 0.0:
        return _MAX_SQNR_DB
    return min(10.0 * math.log10(max(num, _MIN_NSR) / den), _MAX_SQNR_DB)


def _run(model: Path, samples: Sequence[Mapping[str, np.ndarray]]) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return [sess.run(None, dict(s)) for s in samples]


def _exclusion_order(qdq_model: Path, ranking: Sequence[NodeSensitivity]) -> list[str]:
    """Ranked nodes, worst first, each followed by its not yet listed QDQ
    partners (:meth:`_Graph.qdq_partners`) among the ranked nodes: excluding a
    node keeps its own weights and arithmetic in float, but the activations it
    reads and writes stay quantized until those partners are excluded too."""
    import onnx

    graph = _Graph(onnx.shape_inference.infer_shapes(onnx.load(str(qdq_model))))
    by_name = {n.name: n for n in graph.nodes if n.name}
    ranked = {s.node for s in ranking}
    order: dict[str, None] = {}
    for s in ranking:
        order.setdefault(s.node)
        for partner in graph.qdq_partners(by_name[s.node]):
            if partner in ranked:
                order.setdefault(partner)
    return list(order)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def repair_int8(
    fp32_model: Path,
    out_model: Path,
    *,
    quantize: Callable[[Path, Sequence[str]], None],
    evaluate: Callable[[Path], tuple[bool, str]],
    samples: Sequence[dict[str, np.ndarray]],
    work_dir: Path,
    max_excluded: int = 8,
    step: int = 1,
) -> RepairResult:
    """Quantize ``fp32_model``; if the result fails ``evaluate``, keep the most
    sensitive nodes in float until it passes.

    1. ``quantize(path, [])`` then ``evaluate(path)``; a pass ends here.
    2. Otherwise rank that model once (:func:`rank_sensitivity` on ``samples``)
       and re-quantize with the next ``step`` nodes of the exclusion order
       (worst first, each followed by its QDQ partners; module docstring) added
       to ``nodes_to_exclude`` (never more than ``max_excluded`` in all),
       re-evaluating each time, until one passes or ``max_excluded`` (or the
       ranking) is used up. So ``quantize`` runs at most
       ``ceil(max_excluded / step) + 1`` times.

    The final model is copied to ``out_model``: the first passing attempt or,
    when none passed, the best attempt (highest output SQNR vs. the float model
    on ``samples``), which is logged as a warning and reported with
    ``passed=False``. ``fp32_model`` is only read (its digest is checked at the
    end); every attempt and the ranking's augmented models stay in ``work_dir``.
    ``fp32_model`` must be the model ``quantize`` quantizes, so that node names
    in ``nodes_to_exclude`` mean the same nodes.
    """
    if step < 1:
        raise ValueError(f"repair_int8: step must be >= 1, got {step}")
    if max_excluded < 0:
        raise ValueError(f"repair_int8: max_excluded must be >= 0, got {max_excluded}")
    fp32_model, out_model, work_dir = Path(fp32_model), Path(out_model), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    digest = _digest(fp32_model)

    paths: list[Path] = []
    attempts: list[tuple[tuple[str, ...], str]] = []

    def attempt(excluded: tuple[str, ...]) -> bool:
        path = work_dir / f"attempt{len(paths)}.onnx"
        path.unlink(missing_ok=True)
        quantize(path, list(excluded))
        if not path.is_file():
            raise RuntimeError(f"repair_int8: quantize({path}, {list(excluded)}) did not write the model")
        ok, summary = evaluate(path)
        paths.append(path)
        attempts.append((excluded, str(summary)))
        log.info("repair_int8: attempt %d excluding %s: %s -> %s", len(paths) - 1, list(excluded), summary, "pass" if ok else "fail")
        return bool(ok)

    def finish(passed: bool, index: int, ranking: Sequence[NodeSensitivity]) -> RepairResult:
        out_model.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths[index], out_model)
        if _digest(fp32_model) != digest:
            raise RuntimeError(f"repair_int8: {fp32_model} changed during the repair (did quantize write to it?)")
        return RepairResult(passed, attempts[index][0], tuple(attempts), tuple(ranking))

    if attempt(()):
        return finish(True, 0, ())

    ranking = rank_sensitivity(fp32_model, paths[0], samples, work_dir=work_dir / "rank")
    order = _exclusion_order(paths[0], ranking)
    excluded: tuple[str, ...] = ()
    limit = min(max_excluded, len(order))
    while len(excluded) < limit:
        excluded = tuple(order[: min(len(excluded) + step, limit)])
        if attempt(excluded):
            return finish(True, len(paths) - 1, ranking)
    assert len(paths) <= math.ceil(max_excluded / step) + 1

    reference = _run(fp32_model, samples)
    scores = [_output_sqnr(p, reference, samples) for p in paths]
    best = max(range(len(paths)), key=lambda k: (scores[k], -k))
    log.warning(
        "repair_int8: no attempt passed (%d attempts, up to %d of max_excluded=%d nodes in float); "
        "%s holds the best attempt (excluding %s, output SQNR %.1f dB vs. float): %s",
        len(paths),
        len(attempts[-1][0]),
        max_excluded,
        out_model,
        list(attempts[best][0]),
        scores[best],
        attempts[best][1],
    )
    return finish(False, best, ranking)
