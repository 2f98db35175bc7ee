"""Pick the variant and backend that suit a device profile, and say why.

Rules, applied to every variant (each rejection is a reason in the result):

1. its backend's runtime must be installed here;
2. its precision must be one the profile lists (``runtime.precisions``);
3. its estimated memory (file bytes x ``MEMORY_FACTOR``: weights plus the
   runtime's working copy) must fit the effective memory budget, and what the
   SDK itself allocates from the declared inputs (:func:`declared_io_bytes`:
   measurement feeds and stream state at the smallest declared shape, image
   buffers at ``size_hw``) must fit what the budget leaves after the weights;
4. if ``min_cosine`` is given, its measured cosine against the reference must
   reach it (variants without a measurement pass, with a note);
5. a variant that failed its quality gate (in the package only because the
   converter was forced) is skipped.

The accepted ones are ranked by (precision position in the profile, backend
position in the profile), then corrected by measurement, never by the graph
rule alone:

- *recorded*: latencies the converter measured on a machine that matches this one
  (``variant.benchmarks``: the same profile and, for a generic profile, the same
  CPU class: architecture plus the instructions that decide int8 and fp16 speed,
  :func:`machine_class`; a board profile fixes its CPU, so the profile name is
  enough). When every accepted variant has one, the fastest wins; otherwise a
  variant measured slower than the reference is ranked after the reference
  (int8 on an x86 core without VNNI, or an Arm core without dot product, can be
  slower than fp32).
- *timed here*: when the winner is a lower precision than other accepted
  variants and has no recorded measurement for a matching machine, or when the
  best precision is offered by more than one backend, the choice is
  *unproven*: :attr:`Selection.to_time` names the candidates, and
  :mod:`edge_sdk.model` times them once on this device (cached per device,
  package and runtime) and keeps the fastest, preferring the more precise
  variant unless the lighter one is faster by more than the noise margin
  (``Selection.with_measurement``).

Every candidate's reasons say which of the two decided. A forced variant skips
the ranking but not rules 1 and 3.

:func:`lighter_variants` answers the budget governor's question "what could this device run
instead that costs less?" with the same rules 1-5 (see its docs for the ordering).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ._record import frozen
from .backends.base import BackendStatus
from .errors import SelectionError
from .package import Benchmark, Manifest, Variant
from .profiles import DeviceProfile, HardwareFacts

MEMORY_FACTOR = 2.0
SLOWER_MARGIN = 1.03  # measured over 3 % slower than the reference counts as slower (run-to-run noise is ~1-2 %)
MiB = 1024 * 1024
#: Bits per weight of each precision: the cost order of :func:`lighter_variants` without measurements.
PRECISION_BITS = {"fp32": 32, "fp16": 16, "int8": 8, "int4": 4}


@frozen
class Candidate:
    """One variant as the selection saw it."""

    variant_id: str
    backend: str
    precision: str
    accepted: bool
    reasons: tuple[str, ...]
    rank: tuple[float, ...] = (99, 99)
    measured_ms: float | None = None


@frozen
class Selection:
    """The chosen candidate, every candidate with its reasons, and the profile used."""

    chosen: Candidate
    candidates: tuple[Candidate, ...]
    profile: str
    forced: bool = False
    memory_budget_mb: float | None = None
    measured: bool = False

    @property
    def variant_id(self) -> str:
        """The chosen variant's id."""
        return self.chosen.variant_id

    unproven: tuple[str, ...] = ()  # ids of more precise accepted variants the chosen one has no matching measurement against

    @property
    def tied(self) -> tuple[Candidate, ...]:
        """Accepted candidates with the chosen one's precision on other backends."""
        if self.forced:
            return ()
        return tuple(c for c in self.candidates if c.accepted and c.rank[:-1] == self.chosen.rank[:-1] and c.backend != self.chosen.backend)

    @property
    def to_time(self) -> tuple[Candidate, ...]:
        """The candidates besides the chosen one that :mod:`edge_sdk.model` times on this device before
        it trusts the choice: the tied backends, and the more precise variants the chosen one was
        never measured against on a matching machine (``unproven``). Empty when the choice is proven."""
        if self.forced or self.measured:
            return ()
        ids = {c.variant_id for c in self.tied} | set(self.unproven)
        return tuple(c for c in self.candidates if c.variant_id in ids)

    def with_measurement(self, timings_ms: Mapping[str, float], how: str) -> "Selection":
        """Re-decide among the timed candidates by measured median latency (ms per call): the fastest
        wins, except that a more precise candidate within the noise margin (``SLOWER_MARGIN``) of it
        wins instead (a lighter variant must be measurably faster to be worth its quality loss)."""
        cands = []
        for c in self.candidates:
            if c.variant_id in timings_ms:
                ms = timings_ms[c.variant_id]
                c = replace(c, measured_ms=ms, reasons=c.reasons + (f"measured {ms:.3f} ms median ({how})",))
            cands.append(c)
        timed = [c for c in cands if c.measured_ms is not None]
        fastest = min(timed, key=lambda c: (c.measured_ms, c.rank))
        assert fastest.measured_ms is not None
        close = [c for c in timed if c.measured_ms is not None and c.measured_ms <= fastest.measured_ms * SLOWER_MARGIN]
        best = min(close, key=lambda c: (-PRECISION_BITS.get(c.precision, 0), c.measured_ms, c.rank))
        if best is fastest:
            why = "fastest of the candidates timed on this device"
        else:
            why = (
                f"within {SLOWER_MARGIN - 1:.0%} of the fastest ({fastest.variant_id}, {fastest.measured_ms:.3f} ms) and more precise: "
                "a lighter variant must be measurably faster to be chosen"
            )
        cands = [replace(c, reasons=c.reasons + (why,)) if c is best else c for c in cands]
        chosen = next(c for c in cands if c.variant_id == best.variant_id)
        return replace(self, chosen=chosen, candidates=tuple(cands), measured=True)

    def explain(self) -> str:
        """A readable account: the profile, each variant marked chosen (``*``), accepted (``+``) or refused (``-``) with its reasons,
        and the choice."""
        lines = [f"profile {self.profile}" + (f", memory budget {self.memory_budget_mb:.0f} MiB" if self.memory_budget_mb else "")]
        for c in sorted(self.candidates, key=lambda c: (not c.accepted, c.rank, c.variant_id)):
            mark = "*" if c.variant_id == self.chosen.variant_id else ("+" if c.accepted else "-")
            lines.append(f" {mark} {c.variant_id} ({c.backend}, {c.precision}): " + "; ".join(c.reasons))
        lines.append(f"chosen: {self.chosen.variant_id}" + (" (forced)" if self.forced else ""))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict: profile, chosen id, forced, measured, memory budget, and every candidate with its reasons."""
        return {
            "profile": self.profile,
            "chosen": self.chosen.variant_id,
            "forced": self.forced,
            "measured": self.measured,
            "unproven": list(self.unproven),
            "memory_budget_mb": self.memory_budget_mb,
            "candidates": [
                {
                    "variant": c.variant_id,
                    "backend": c.backend,
                    "precision": c.precision,
                    "accepted": c.accepted,
                    "reasons": list(c.reasons),
                    "measured_ms": c.measured_ms,
                }
                for c in self.candidates
            ],
        }


#: The CPU instructions that decide how fast int8 and fp16 kernels run (ONNX Runtime's MLAS picks its
#: int8 GEMM by them: AVX-512 VNNI / AVX-VNNI / AMX on x86, SDOT (``asimddp``) / I8MM on Arm; fp16
#: arithmetic needs ``fphp``/``asimdhp``). Two machines with the same architecture and the same set of
#: these run a package's variants in the same order of speed.
SPEED_FEATURES = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2", "asimddp", "i8mm", "fphp", "asimdhp")


def describe_machine(facts: HardwareFacts) -> str:
    """``"<arch> <cpu model> x<cores> (<speed features>)"``: what the converter records with each
    benchmark (``Benchmark.machine``) and what :func:`machine_class` reads back."""
    feats = [x for x in SPEED_FEATURES if x in facts.cpu_features]
    return f"{facts.machine or 'unknown'} {facts.cpu_model or 'unknown CPU'} x{facts.cpu_count or '?'}" + (f" ({', '.join(feats)})" if feats else "")


def machine_class(description: str) -> tuple[str, frozenset[str]] | None:
    """(architecture, speed features) of a :func:`describe_machine` string; None for an empty one.
    Features outside :data:`SPEED_FEATURES` are ignored (older packages recorded a shorter list: only
    the features both sides could have recorded are compared, see :func:`same_machine_class`)."""
    text = description.strip()
    if not text:
        return None
    arch = text.split()[0]
    feats: frozenset[str] = frozenset()
    if text.endswith(")") and "(" in text:
        feats = frozenset(f.strip() for f in text[text.rindex("(") + 1 : -1].split(",") if f.strip() in SPEED_FEATURES)
    return arch, feats


#: The features the converter recorded before :data:`SPEED_FEATURES` (packages made by 0.x releases).
_OLD_RECORDED = frozenset(("avx512_vnni", "avx_vnni", "avx2", "asimddp", "fphp", "i8mm"))


def same_machine_class(recorded: str, here: str) -> bool:
    """True when a benchmark recorded on ``recorded`` speaks for ``here``: same architecture and the same
    speed features (compared over the features the recorded string could have listed)."""
    a, b = machine_class(recorded), machine_class(here)
    if a is None or b is None or a[0] != b[0]:
        return False
    known = SPEED_FEATURES if a[1] - _OLD_RECORDED else _OLD_RECORDED
    return a[1] == b[1] & frozenset(known)


def declared_io_bytes(manifest: Manifest, v: Variant) -> tuple[int, str]:
    """Bytes the SDK allocates on the caller's side from what ``manifest`` declares for variant ``v``,
    and which field needs the most: every input at its smallest declared shape (load-time measurement
    feeds, stream state), plus, for an image input, the float32 resize buffer at ``size_hw``."""
    total = 0
    worst = (0, "")
    for s in manifest.inputs_for(v):
        n = s.nbytes(s.min_shape())
        what = f"input {s.name!r} at its smallest shape {list(s.min_shape())} {s.dtype}"
        if s.preprocess is not None:
            h, w = s.preprocess.size_hw
            n += h * w * s.preprocess.channels * 4
            what = f"input {s.name!r} preprocess.size_hw {list(s.preprocess.size_hw)} with shape {list(s.min_shape())} {s.dtype}"
        total += n
        worst = max(worst, (n, what))
    return total, worst[1]


def _judge(
    v: Variant,
    profile: DeviceProfile,
    backends: Mapping[str, BackendStatus],
    budget_mb: float | None,
    min_cosine: float | None,
    io: tuple[int, str] = (0, ""),
) -> Candidate:
    reasons: list[str] = []
    ok = True
    rt = profile.runtime
    st = backends.get(v.backend)
    if st is None or not st.available:
        ok = False
        reasons.append(f"backend {v.backend} not available here ({st.detail if st else 'unknown backend'})")
    else:
        reasons.append(f"{st.runtime} {st.version} installed")
    if v.generation is not None:
        # Decoding reads every weight once per token: on CPUs and GPUs alike it is bound by memory
        # bandwidth, so fewer bits per weight go first; fp16 only where the profile computes in it.
        order = ["int4", "int8"] + (["fp16"] if "fp16" in rt.precisions else []) + ["fp32"]
        if v.precision in order:
            p_rank = order.index(v.precision)
            reasons.append(f"precision {v.precision} is #{p_rank + 1} in the text-generation order {order} (decode is memory-bound)")
        else:
            p_rank = 99
            ok = False
            reasons.append(f"precision {v.precision} not in the text-generation order {order} for this profile")
    elif v.precision in rt.precisions:
        p_rank = rt.precisions.index(v.precision)
        reasons.append(f"precision {v.precision} is #{p_rank + 1} in the profile's order {list(rt.precisions)}")
    else:
        p_rank = 99
        ok = False
        reasons.append(f"precision {v.precision} not in the profile's precisions {list(rt.precisions)}")
    b_rank = rt.backends.index(v.backend) if v.backend in rt.backends else 50
    if v.backend not in rt.backends:
        reasons.append(f"backend {v.backend} not in the profile's backends {list(rt.backends)}; ranked last")
    need_mb = v.total_size * MEMORY_FACTOR / MiB
    if budget_mb is not None:
        if need_mb > budget_mb:
            ok = False
            reasons.append(f"needs ~{need_mb:.1f} MiB, over the {budget_mb:.0f} MiB budget")
        else:
            reasons.append(f"~{need_mb:.1f} MiB fits the {budget_mb:.0f} MiB budget")
        io_mb = io[0] / MiB
        if io_mb > budget_mb - need_mb:
            ok = False
            reasons.append(
                f"declared inputs need ~{io_mb:.1f} MiB (largest: {io[1]}), over the {max(0.0, budget_mb - need_mb):.0f} MiB "
                f"the {budget_mb:.0f} MiB budget leaves after the weights"
            )
    if min_cosine is not None:
        cos = v.quality.cosine if v.quality else None
        if cos is None:
            reasons.append("no measured cosine; quality gate not applied")
        elif cos < min_cosine:
            ok = False
            reasons.append(f"cosine {cos:.4f} vs reference below the {min_cosine} gate")
        else:
            reasons.append(f"cosine {cos:.4f} meets the {min_cosine} gate")
    g = v.generation
    if g is not None:
        reasons.append(
            f"{g.bits}-bit weights{f' ({g.method}, block {g.block_size})' if g.method else ''}"
            f"{f', {len(g.int8_tensors)} tensors in int8' if g.int8_tensors else ''}: {g.weight_bytes_per_token / MiB:.1f} MiB read per token, "
            f"KV {g.kv_bytes_per_token / 1024:.1f} KiB per token ({g.kv_dtype})"
        )
        if budget_mb is not None:
            kv_mb = budget_mb - need_mb
            reasons.append(f"~{max(0.0, kv_mb) * MiB / g.kv_bytes_per_token:.0f} tokens of KV fit the rest of the budget")
        q = v.quality
        if q is not None and q.perplexity is not None:
            gap = f" ({q.perplexity_gap:+.1%} vs reference)" if q.perplexity_gap is not None else ""
            agree = f", top-1 agreement {q.top1_agreement:.3f}" if q.top1_agreement is not None else ""
            reasons.append(f"perplexity {q.perplexity:.3f}{gap}{agree}")
        if g.tpot_ms is not None:
            reasons.append(
                f"measured when converted: TTFT {g.ttft_ms} ms, TPOT {g.tpot_ms} ms on {g.bench_threads} threads ({g.bench_machine})"
            )
    if v.gate is not None and not v.gate.passed:
        ok = False
        reasons.append("failed its quality gate when packaged (" + "; ".join(v.gate.failures) + "); only used when asked for by id")
    return Candidate(v.id, v.backend, v.precision, ok, tuple(reasons), (p_rank, b_rank))


def _measured(v: Variant, profile: DeviceProfile, machine: str | None) -> Benchmark | None:
    """The batch-1 benchmark of ``v`` that speaks for this machine, with the most threads: one recorded on
    ``profile`` and, when ``machine`` (this machine's :func:`describe_machine`) is given, on the same
    CPU class; a benchmark without a machine counts only for a board profile (a board fixes its CPU;
    ``generic-x86_64`` spans CPUs with and without VNNI)."""
    bs = [
        b
        for b in v.benchmarks
        if b.profile == profile.name
        and b.batch == 1
        and (machine is None or (same_machine_class(b.machine, machine) if b.machine else not profile.generic))
    ]
    return max(bs, key=lambda b: b.threads) if bs else None


def _apply_benchmarks(manifest: Manifest, profile: DeviceProfile, cands: tuple[Candidate, ...], machine: str | None) -> tuple[Candidate, ...]:
    by_id = {v.id: v for v in manifest.variants}
    ok = [c for c in cands if c.accepted]
    meas = {c.variant_id: _measured(by_id[c.variant_id], profile, machine) for c in ok}
    if len(ok) > 1 and all(m is not None for m in meas.values()):
        fastest = min(m.latency_ms for m in meas.values() if m is not None)
        out = []
        for c in cands:
            m = meas.get(c.variant_id)
            if m is not None:
                # Within the noise margin of the fastest counts as the fastest: the more precise one wins then.
                close = m.latency_ms <= fastest * SLOWER_MARGIN
                c = replace(
                    c,
                    rank=(fastest if close else m.latency_ms, -PRECISION_BITS.get(c.precision, 0) if close else 0, *c.rank),
                    reasons=c.reasons + (f"measured {m.latency_ms:.3f} ms at batch 1 on {profile.name} when packaged ({m.machine or 'this board'})",),
                )
            out.append(c)
        return tuple(out)
    ref = manifest.reference_variant
    ref_rank = next((c.rank for c in cands if c.variant_id == ref.id), None)
    out = []
    for c in cands:
        m = meas.get(c.variant_id)
        if (
            c.accepted
            and c.variant_id != ref.id
            and m is not None
            and m.reference_latency_ms is not None
            and m.latency_ms > m.reference_latency_ms * SLOWER_MARGIN
        ):
            c = replace(
                c,
                rank=((ref_rank[0] if ref_rank else c.rank[0]) + 0.5, c.rank[1]),
                reasons=c.reasons
                + (
                    f"measured slower than the reference {ref.id} on {profile.name} when packaged ({m.latency_ms:.3f} vs "
                    f"{m.reference_latency_ms:.3f} ms, {m.machine or 'this board'}): ranked after it",
                ),
            )
        out.append(c)
    return tuple(out)


def select_variant(
    manifest: Manifest,
    profile: DeviceProfile,
    backends: Mapping[str, BackendStatus],
    *,
    memory_budget_mb: float | None = None,
    variant: str | None = None,
    min_cosine: float | None = None,
    machine: str | None = None,
) -> Selection:
    """Judge every variant and choose one. Raises SelectionError when none fits
    (the message lists each variant and why it lost) or ``variant`` is unknown
    or cannot run here.

    ``machine``: this machine's :func:`describe_machine`; recorded benchmarks then count only when made
    on the same CPU class (see the module's docs), and a lighter winner without one is ``unproven``
    (:attr:`Selection.to_time`). None: benchmarks count by profile alone and nothing is unproven."""
    cands = tuple(_judge(v, profile, backends, memory_budget_mb, min_cosine, declared_io_bytes(manifest, v)) for v in manifest.variants)
    if variant is None:
        cands = _apply_benchmarks(manifest, profile, cands, machine)
    if variant is not None:
        ids = [c.variant_id for c in cands]
        if variant not in ids:
            raise SelectionError(f"variant {variant!r} is not in package {manifest.name}; it has {ids}")
        c = next(c for c in cands if c.variant_id == variant)
        hard = [r for r in c.reasons if "not available" in r or "over the" in r]  # gate failures may be forced
        if hard:
            raise SelectionError(f"forced variant {variant!r} cannot run here: {'; '.join(hard)}")
        c = replace(c, accepted=True, reasons=c.reasons + ("forced by the caller",))
        cands = tuple(c if x.variant_id == variant else x for x in cands)
        return Selection(c, cands, profile.name, forced=True, memory_budget_mb=memory_budget_mb)
    ok = [c for c in cands if c.accepted]
    if not ok:
        detail = "; ".join(f"{c.variant_id}: {', '.join(r for r in c.reasons)}" for c in cands)
        raise SelectionError(f"no variant of {manifest.name} suits profile {profile.name}: {detail}")
    best = min(ok, key=lambda c: (c.rank, c.variant_id))
    unproven: tuple[str, ...] = ()
    if machine is not None and _measured(manifest.variant(best.variant_id), profile, machine) is None:
        # A lighter winner by the profile's rule alone: time it against every more precise accepted variant
        # (on any backend: a float TFLite model can beat a quantized ONNX one on a CPU without VNNI).
        bits = PRECISION_BITS.get(best.precision, 0)
        unproven = tuple(c.variant_id for c in sorted(ok, key=lambda c: (c.rank, c.variant_id)) if PRECISION_BITS.get(c.precision, 0) > bits)
    why = "best rank (precision, backend) among accepted variants"
    if unproven:
        why += f"; not measured on this CPU class: timed against {', '.join(unproven)} on this device before it is trusted"
    best = replace(best, reasons=best.reasons + (why,))
    cands = tuple(best if c.variant_id == best.variant_id else c for c in cands)
    return Selection(best, cands, profile.name, memory_budget_mb=memory_budget_mb, unproven=unproven)


def lighter_variants(
    manifest: Manifest,
    current_variant_id: str,
    profile: DeviceProfile,
    available_backends: Mapping[str, BackendStatus] | None = None,
    *,
    memory_budget_mb: float | None = None,
    min_cosine: float | None = None,
    machine: str | None = None,
) -> list[str]:
    """The ids of the variants that cost less than ``current_variant_id`` on ``profile``,
    mildest step first and the lightest last (the last resort): e.g. from fp32, fp16 (when the
    profile lists it), then int8, then int4.

    Eligibility is :func:`select_variant`'s rules 1-5 (backend available, precision in the
    profile, fits ``memory_budget_mb``, meets ``min_cosine``, passed its quality gate);
    ``available_backends`` defaults to probing the runtimes the package uses.

    Cost, in this order:

    - measured: when the current variant and every eligible other one have a batch-1 latency
      measured on this profile (``variant.benchmarks``), a variant is lighter when it was measured
      faster than the current one by more than the noise margin (``SLOWER_MARGIN``); they are
      ordered slowest first (the smallest step down), then by the profile's backend order.
    - otherwise by bits per weight (:data:`PRECISION_BITS`): a variant with fewer bits than the
      current one is lighter, unless it was measured on this profile more than ``SLOWER_MARGIN``
      slower than the reference (int8 on an Arm core without dot product: fewer bits, more busy
      time). Ordered by bits, most first; within one precision by the profile's backend order,
      then the smaller file (``size_bytes``). A variant with the same precision on another
      backend is an alternative, not a lighter one.

    ``machine``: as for :func:`select_variant` (benchmarks from another CPU class do not count).

    Raises SelectionError when ``current_variant_id`` is not in the package.
    """
    by_id = {v.id: v for v in manifest.variants}
    if current_variant_id not in by_id:
        raise SelectionError(f"variant {current_variant_id!r} is not in package {manifest.name}; it has {list(by_id)}")
    if available_backends is None:
        from .backends.base import backend_status

        available_backends = {b: backend_status(b) for b in sorted({v.backend for v in manifest.variants})}
    current = by_id[current_variant_id]
    ok = [
        c
        for c in (
            _judge(v, profile, available_backends, memory_budget_mb, min_cosine, declared_io_bytes(manifest, v))
            for v in manifest.variants
            if v.id != current.id
        )
        if c.accepted
    ]
    meas = {c.variant_id: _measured(by_id[c.variant_id], profile, machine) for c in ok}
    cur_m = _measured(current, profile, machine)
    if cur_m is not None and ok and all(m is not None for m in meas.values()):
        lat = {k: m.latency_ms for k, m in meas.items() if m is not None}
        lighter = [c for c in ok if lat[c.variant_id] * SLOWER_MARGIN < cur_m.latency_ms]
        lighter.sort(key=lambda c: (-lat[c.variant_id], c.rank[1], by_id[c.variant_id].total_size, c.variant_id))
        return [c.variant_id for c in lighter]
    cur_bits = PRECISION_BITS[current.precision]

    def slower_than_reference(vid: str) -> bool:
        m = meas[vid]
        return m is not None and m.reference_latency_ms is not None and m.latency_ms > m.reference_latency_ms * SLOWER_MARGIN

    lighter = [c for c in ok if PRECISION_BITS[c.precision] < cur_bits and not slower_than_reference(c.variant_id)]
    lighter.sort(key=lambda c: (-PRECISION_BITS[c.precision], c.rank[1], by_id[c.variant_id].total_size, c.variant_id))
    return [c.variant_id for c in lighter]
