"""``edge-sdk bench`` on a text-generation package: time to first token, time per output token,
tokens/s, memory, and (``--vs-raw``) onnxruntime-genai on the same ``.onnx`` file.

::

    edge-sdk bench smollm2-135m/ [--prompt-tokens 64] [--new-tokens 64] [--runs 5] [--threads 2] [--vs-raw] [--json F]

What one run is: ``DecoderModel.generate`` of a P-token prompt (random token ids from a fixed seed,
made into text that encodes back to exactly those ids, or a ``--prompt`` text), G new tokens,
greedy, ``ignore_eos``. Per run the figures come from the result's
:class:`~edge_sdk.generation.results.GenerationTimings`: TTFT (call start to the first token:
tokenize + prefill + the first sample), TPOT (mean time per token after the first), prefill, and
the session's own decode time; the Python loop's overhead per token is TPOT minus the session's
time per step. Reported: p50/p90/p99 over the runs (numpy's linear interpolation: with 5 runs the
p99 is close to the slowest run), tokens/s = 1000 / TPOT p50, prefill tokens/s = P / prefill p50.

``vs_raw``: onnxruntime-genai (https://onnxruntime.ai/docs/genai/, a peer runtime, not a
dependency: imported only here) runs the same prompt ids on the same variant file. A temporary
folder holds a link to the ``.onnx`` (and its external data), the package's ``tokenizer.json``, a
plain ``tokenizer_config.json`` (genai 0.18 refuses the ``TokenizersBackend`` class that
transformers 5 writes) and a ``genai_config.json`` written from the package's ``[generation]``
table (the layout of https://onnxruntime.ai/docs/genai/reference/config.html: decoder inputs
``input_ids``, ``attention_mask``, ``past_key_values.%d.key|value``, outputs ``logits``,
``present.%d.key|value``, ``past_present_share_buffer`` true, so genai binds one KV buffer of
``max_length`` = P + G tokens as this SDK does). Runs are interleaved in one process (ours, genai,
ours, genai, ...) so a machine that drifts affects both alike; the greedy token ids are compared
run by run. genai has no ``ignore_eos``: its ``eos_token_id`` is set to the lowest id the SDK did not
generate in the warm-up, so both generate exactly G tokens (a differing id is reported anyway).

Peak RSS per runtime is measured in a fresh child process each (``python -m
edge_sdk.bench.generation --child SPEC``): both runtimes in one process would mix their memory.
The figure is the child's ``VmHWM`` (``/proc/self/status``: the kernel's high-water mark of its
resident memory; ``ru_maxrss`` elsewhere; not on Linux, where ``ru_maxrss`` survives ``exec`` and a
child would report its parent's peak), with the child's RSS before loading (interpreter and
imports) reported beside it. The KV buffer is allocated with ``np.zeros`` (pages the kernel maps on first
write), so RSS grows with the tokens written, not with the allocated KV.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from .._version import __version__
from ..backends.genai import require_genai as _require_genai
from ..errors import ContextBudgetError, GenerationError, OptionsError, PromptError
from .machine import CPU_FLAGS
from .machine import loadavg as _loadavg
from .options import BenchError, named_variants

if TYPE_CHECKING:  # pragma: no cover
    from ..generation.decoder import DecoderModel
    from ..package import ModelPackage, Variant

__all__ = [
    "DEFAULT_NEW_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "DEFAULT_RUNS",
    "GENAI_INSTALL",
    "GenaiDecoder",
    "GenerationBenchOptions",
    "cpu_facts",
    "first_difference",
    "make_prompt",
    "measure_peak_rss",
    "render_generation_text",
    "require_genai",
    "run_generation_bench",
    "write_generation_json",
]

DEFAULT_PROMPT_TOKENS = 64
DEFAULT_NEW_TOKENS = 64
DEFAULT_RUNS = 5
GENAI_INSTALL = "pip install onnxruntime-genai"
SCHEMA = "edge-sdk-bench-generation/1"
MiB = 1024 * 1024
_pc = time.perf_counter
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class GenerationBenchOptions:
    """One generation benchmark's settings (recorded in the report).

    ``variants``: ids (empty and ``all_variants`` False: the one ``load`` selects);
    ``prompt_tokens`` P (ignored with ``prompt``: its own token count is used), ``new_tokens`` G,
    ``runs`` measured generations per variant and runtime, ``warmup`` generations first (excluded);
    ``seed`` of the random prompt ids; ``threads`` (None: the profile's); ``vs_raw``: also
    onnxruntime-genai on the same file; ``memory``: peak RSS per runtime in child processes;
    ``context``: KV tokens to allocate (None: what ``load`` plans); ``profile``, ``root``, ``cache_dir``
    as for ``load``."""

    variants: tuple[str, ...] = ()
    all_variants: bool = False
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    new_tokens: int = DEFAULT_NEW_TOKENS
    runs: int = DEFAULT_RUNS
    warmup: int = 1
    prompt: str | None = None
    seed: int = 0
    threads: int | None = None
    vs_raw: bool = False
    memory: bool = True
    context: int | None = None
    profile: str | None = None
    root: str = "/"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "new_tokens", "runs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise OptionsError(f"{name}: expected an int >= 1, got {v!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise OptionsError(f"warmup: expected an int >= 0, got {self.warmup!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1):
            raise OptionsError(f"threads: expected an int >= 1 or None, got {self.threads!r}")
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
            raise OptionsError(f"prompt: expected a non-empty str or None, got {self.prompt!r}")
        if self.variants and self.all_variants:
            raise OptionsError("variants and all_variants: give one or the other")
        object.__setattr__(self, "variants", tuple(self.variants))

    def to_dict(self) -> dict[str, Any]:
        """Every field, by name."""
        return asdict(self)


# ------------------------------------------------------------------------------------------ facts


def cpu_facts(root: str = "/") -> dict[str, Any]:
    """CPU model, count, the flags of :data:`CPU_FLAGS` (present on every processor) and the load
    average now: what every generation figure is recorded with."""
    from ..profiles.facts import read_facts

    f = read_facts(root)
    return {
        "machine": platform.machine(),
        "cpu_model": f.cpu_model,
        "cpu_count": os.cpu_count(),
        "flags": {x: x in f.cpu_features for x in CPU_FLAGS},
        "mem_total_mb": f.mem_total_mb,
        "loadavg": _loadavg(),
    }


def _rss_now_mb() -> float | None:
    try:
        import psutil

        return float(psutil.Process().memory_info().rss) / MiB
    except Exception:  # psutil missing or the platform refuses: the figure is optional
        return None


def _peak_rss_mb() -> tuple[float | None, str]:
    """This process's peak resident set size (MiB) and where it was read.

    Linux: ``VmHWM`` of ``/proc/self/status`` (the high-water mark of this address space,
    https://man7.org/linux/man-pages/man5/proc_pid_status.5.html). Not ``ru_maxrss``: Linux carries
    it across ``exec`` (a child started by ``subprocess`` reports at least its parent's peak at the
    fork). Elsewhere ``getrusage(RUSAGE_SELF).ru_maxrss`` (bytes on macOS, KiB elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0, "VmHWM (/proc/self/status)"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return (peak / MiB if sys.platform == "darwin" else peak / 1024.0), "getrusage(RUSAGE_SELF).ru_maxrss"
    except (ImportError, OSError, ValueError):
        return None, "unavailable"


def _pct(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
    }


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where the two id sequences differ (a length difference counts at the
    shorter one's end), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ------------------------------------------------------------------------------------------ prompt


def make_prompt(model: "DecoderModel", prompt_tokens: int, seed: int, text: str | None = None) -> tuple[str, list[int], str]:
    """The prompt text, the ids ``model.encode`` makes of it and how it was made.

    With ``text``: that text as given. Otherwise a text of exactly ``prompt_tokens`` tokens built
    from random ids (seeded, special tokens excluded): each id's text is appended when the whole
    text then encodes to the previous ids plus one (a byte-level BPE may merge a piece with its
    neighbour or split a partial UTF-8 character, and a control character is refused in
    prompts; such a draw is skipped). GenerationError if the
    tokenizer keeps refusing."""
    if text is not None:
        ids = model.encode(text)
        return text, ids, f"given text ({len(ids)} tokens)"
    tok = model.tokenizer
    rng = np.random.default_rng(seed)
    special = tok.special_ids
    pool = np.asarray([i for i in range(tok.vocab_size) if i not in special], dtype=np.int64)
    if pool.size == 0:
        raise GenerationError(f"random prompt: the tokenizer's {tok.vocab_size} ids are all special tokens")
    s = ""
    ids = model.encode(s) if model.spec.add_bos else []
    if len(ids) > prompt_tokens:
        raise GenerationError(f"random prompt: {prompt_tokens} tokens asked for, the package adds {len(ids)} (BOS) by itself")
    misses = 0
    while len(ids) < prompt_tokens:
        piece = tok.decode([int(rng.choice(pool))], skip_special_tokens=True)
        try:
            got = model.encode(s + piece) if (s + piece).strip() else []
        except PromptError:  # a control character the SDK refuses in prompts: draw again
            got = []
        if len(got) == len(ids) + 1 and got[: len(ids)] == ids:
            s, ids = s + piece, got
            continue
        misses += 1
        if misses > 50 * prompt_tokens + 100:
            raise GenerationError(
                f"random prompt: no text of exactly {prompt_tokens} tokens after {misses} draws (seed {seed}); pass a prompt text"
            )
    return s, ids, f"{prompt_tokens} random token ids (seed {seed}, special tokens excluded), as text"


# ------------------------------------------------------------------------------------------ onnxruntime-genai


def require_genai(purpose: str = "--vs-raw on a text-generation package") -> Any:
    """The ``onnxruntime_genai`` module (imported behind the backend seam, :mod:`edge_sdk.backends.genai`),
    or MissingDependencyError naming the pip command."""
    return _require_genai(purpose, GENAI_INSTALL)


def genai_config(pkg: "ModelPackage", variant: "Variant", threads: int, max_length: int, eos_token_id: int) -> dict[str, Any]:
    """The ``genai_config.json`` for ``variant`` (https://onnxruntime.ai/docs/genai/reference/config.html)."""
    spec = pkg.manifest.generation
    assert spec is not None
    arch = spec.architecture if spec.architecture in ("llama", "qwen2", "mistral", "phi3", "gemma") else "llama"
    return {
        "model": {
            "type": arch,
            "bos_token_id": spec.bos_token_id if spec.bos_token_id is not None else eos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": spec.pad_token_id if spec.pad_token_id is not None else eos_token_id,
            "vocab_size": spec.vocab_size,
            "context_length": spec.context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": [], "intra_op_num_threads": threads},
                "filename": Path(variant.file).name,
                "head_size": spec.head_dim,
                "hidden_size": spec.n_heads * spec.head_dim,
                "num_attention_heads": spec.n_heads,
                "num_hidden_layers": spec.n_layers,
                "num_key_value_heads": spec.n_kv_heads,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"},
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "max_length": max_length,
            "min_length": 0,
            "past_present_share_buffer": True,
            "early_stopping": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
            "length_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "diversity_penalty": 0.0,
        },
    }


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(src.resolve(), dst)
    except OSError:  # no symlinks here (some Windows setups, some file systems): copy
        import shutil

        shutil.copyfile(src, dst)


class GenaiDecoder:
    """onnxruntime-genai on ``variant``'s file: a temporary folder with the file linked, the
    tokenizer and a written ``genai_config.json``; :meth:`generate` runs one greedy generation.
    ``close()`` removes the folder. MissingDependencyError when onnxruntime-genai is missing,
    BenchError when it refuses the model."""

    def __init__(self, pkg: "ModelPackage", variant: "Variant", threads: int, max_length: int, eos_token_id: int) -> None:
        og = require_genai()
        spec = pkg.manifest.generation
        if spec is None:
            raise BenchError(f"package {pkg.manifest.name} is not a text-generation package")
        self._og = og
        self.max_length = int(max_length)
        self._tmp = tempfile.TemporaryDirectory(prefix="edge-bench-genai-")
        d = Path(self._tmp.name)
        _link(pkg.path_of(variant.file), d / Path(variant.file).name)
        src_dir = Path(variant.file).parent
        for ext in variant.external_data:  # external data is named relative to the model file
            rel = Path(ext.file)
            _link(pkg.path_of(ext.file), d / (rel.relative_to(src_dir) if src_dir != Path(".") else rel))
        _link(pkg.path_of(spec.tokenizer.file), d / "tokenizer.json")
        tcfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": spec.context_length}
        self.config = genai_config(pkg, variant, threads, max_length, eos_token_id)
        (d / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1) + "\n", encoding="utf-8")
        (d / "genai_config.json").write_text(json.dumps(self.config, indent=1) + "\n", encoding="utf-8")
        self.folder = d
        t0 = _pc()
        try:
            self.model = og.Model(str(d))
        except Exception as e:  # genai raises RuntimeError with its own message
            self._tmp.cleanup()
            raise BenchError(f"onnxruntime-genai {og.__version__} could not load variant {variant.id} ({variant.file}): {e}") from e
        self.load_ms = (_pc() - t0) * 1e3
        self.version = str(og.__version__)

    def generate(self, ids: Sequence[int]) -> dict[str, Any]:
        """Greedy from ``ids`` up to ``max_length`` tokens in all: the new ids, TTFT (append the
        prompt, which runs the prefill, and pick the first token), TPOT (mean after the first),
        prefill (``append_tokens`` alone)."""
        og = self._og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.max_length, do_sample=False)
        gen = og.Generator(self.model, params)
        t0 = _pc()
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        t_prefill = _pc()
        stamps: list[float] = []
        while not gen.is_done():
            gen.generate_next_token()
            stamps.append(_pc())
        seq = [int(x) for x in gen.get_sequence(0)]
        del gen
        out = seq[len(ids) :]
        n = len(out)
        return {
            "token_ids": out,
            "ttft_ms": (stamps[0] - t0) * 1e3 if stamps else (t_prefill - t0) * 1e3,
            "tpot_ms": (stamps[-1] - stamps[0]) / (n - 1) * 1e3 if n > 1 else None,
            "prefill_ms": (t_prefill - t0) * 1e3,
        }

    def close(self) -> None:
        """Drop the model and remove the temporary folder (idempotent)."""
        self.model = None
        self._tmp.cleanup()


# ------------------------------------------------------------------------------------------ one row


def _sdk_run(model: "DecoderModel", text: str, new_tokens: int) -> dict[str, Any]:
    r = model.generate(text, max_new_tokens=new_tokens, ignore_eos=True)
    t = r.timings
    n = r.usage.completion_tokens
    sess = model._sess
    step_ms = t.decode_ms / (n - 1) if n > 1 else None
    return {
        "token_ids": list(r.token_ids),
        "prompt_tokens": r.usage.prompt_tokens,
        "ttft_ms": t.ttft_ms,
        "tpot_ms": t.tpot_ms,
        "prefill_ms": t.prefill_ms,
        "decode_ms": t.decode_ms,
        "step_ms": step_ms,
        "overhead_ms": None if t.tpot_ms is None or step_ms is None else t.tpot_ms - step_ms,
        "kv_tokens_in_use": sess.position if sess is not None else None,
    }


def column(records: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """``key`` of every record that has it (not None), as floats: one column of a run's per-request records."""
    return [float(r[key]) for r in records if r.get(key) is not None]


def _summarise(runs: list[dict[str, Any]], prompt_tokens: int) -> dict[str, Any]:
    def col(k: str) -> list[float]:
        return column(runs, k)

    tpot = col("tpot_ms")
    prefill = col("prefill_ms")
    out: dict[str, Any] = {
        "runs": len(runs),
        "generated_tokens": len(runs[0]["token_ids"]),
        "ttft_ms": _pct(col("ttft_ms")),
        "tpot_ms": _pct(tpot) if tpot else None,
        "prefill_ms": _pct(prefill),
    }
    out["tokens_per_s"] = round(1000.0 / out["tpot_ms"]["p50"], 3) if tpot and out["tpot_ms"]["p50"] > 0 else None
    p50 = out["prefill_ms"]["p50"]
    out["prefill_tokens_per_s"] = round(prompt_tokens / (p50 / 1e3), 3) if p50 > 0 else None
    if col("step_ms"):
        out["session_step_ms"] = _pct(col("step_ms"))
        out["loop_overhead_ms_per_token"] = _pct(col("overhead_ms"))
    return out


# ------------------------------------------------------------------------------------------ the run


def run_generation_bench(
    package: "str | os.PathLike[str] | ModelPackage",
    options: GenerationBenchOptions | None = None,
    *,
    argv: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Benchmark a text-generation ``package`` on this machine; returns the report (JSON-ready).
    Raises BenchError (not a text-generation package, unknown variant, nothing runnable),
    MissingDependencyError (``vs_raw`` without onnxruntime-genai), ContextBudgetError (P + G over
    the KV buffer), and what ``load`` raises."""
    from ..backends.base import all_backend_status
    from ..model import LoadOptions, load_decoder
    from ..package import ModelPackage, default_cache_dir
    from ..profiles import resolve_profile

    opts = options or GenerationBenchOptions()
    say = progress or _quiet
    if opts.vs_raw:
        og = require_genai()  # before anything long runs
    started = _dt.datetime.now(_dt.timezone.utc)
    t_origin = _pc()
    cpu_before = cpu_facts(opts.root)
    cache = Path(opts.cache_dir) if opts.cache_dir else default_cache_dir()
    pkg = package if isinstance(package, ModelPackage) else ModelPackage.open(package, cache_dir=cache)
    manifest = pkg.manifest
    if manifest.task != "text-generation" or manifest.generation is None:
        raise BenchError(f"package {manifest.name} has task {manifest.task!r}; the generation benchmark needs a text-generation package")
    detection = resolve_profile(opts.profile, root=opts.root)
    base = LoadOptions(threads=opts.threads, cache_dir=cache, root=opts.root, context=opts.context)
    warnings: list[str] = []

    # -- which variants -------------------------------------------------------------------------------
    statuses = all_backend_status()
    chosen = named_variants(manifest, statuses, opts.all_variants, opts.variants, warnings)
    if chosen is not None:
        ids = chosen
    else:
        with load_decoder(pkg, detection.profile, base) as m:
            ids = [m.variant.id]
    if not ids:
        raise BenchError(f"no variant of {manifest.name} can run here: " + "; ".join(warnings))

    rows: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    prompt_info: dict[str, Any] = {}
    children: list[dict[str, Any]] = []
    for vid in ids:
        say(f"loading {vid}")
        model = load_decoder(pkg, detection.profile, replace(base, variant=vid))
        genai: GenaiDecoder | None = None
        try:
            text, prompt_ids, how = make_prompt(model, opts.prompt_tokens, opts.seed, opts.prompt)
            P, G = len(prompt_ids), opts.new_tokens
            if P + G > model.max_context:
                raise ContextBudgetError(
                    f"prompt {P} + new tokens {G} = {P + G} > the KV buffer of {model.max_context} tokens ({model.context.reason}); "
                    f"lower them or pass --context"
                )
            prompt_info = {"text": text, "token_ids": prompt_ids, "tokens": P, "source": how}
            threads = model.session_info.threads
            say(f"{vid}: warm-up ({opts.warmup}) and {opts.runs} runs of {P} + {G} tokens on {threads} thread(s)")
            warm = [_sdk_run(model, text, G) for _ in range(max(opts.warmup, 1 if opts.vs_raw else 0))]
            ours_ids = warm[0]["token_ids"] if warm else None
            genai_eos = -1
            g_runs: list[dict[str, Any]] = []
            if opts.vs_raw:
                seen = set(ours_ids or ())
                genai_eos = next(i for i in range(manifest.generation.vocab_size) if i not in seen)
                genai = GenaiDecoder(pkg, model.variant, threads, P + G, genai_eos)
                for _ in range(max(opts.warmup, 1)):
                    genai.generate(prompt_ids)
            s_runs: list[dict[str, Any]] = []
            for _ in range(opts.runs):
                s_runs.append(_sdk_run(model, text, G))
                if genai is not None:
                    g_runs.append(genai.generate(prompt_ids))
            g = model.variant.generation
            assert g is not None
            sdk_row = _summarise(s_runs, P)
            in_use = s_runs[-1]["kv_tokens_in_use"]
            sdk_row.update(
                {
                    "variant": vid,
                    "runtime": "edge_sdk",
                    "runtime_version": __version__,
                    "backend": f"onnxruntime {model.session_info.runtime_version}",
                    "threads": threads,
                    "allow_spinning": _spinning(model),
                    "prompt_tokens": P,
                    "new_tokens": G,
                    "precision": model.variant.precision,
                    "bits": g.bits,
                    "weight_bytes_per_token": g.weight_bytes_per_token,
                    "file_bytes": model.variant.total_size,
                    "kv": {
                        "bytes_per_token": g.kv_bytes_per_token,
                        "allocated_tokens": model.context.max_tokens,
                        "allocated_bytes": model.context.kv_bytes,
                        "in_use_tokens": in_use,
                        "in_use_bytes": None if in_use is None else in_use * g.kv_bytes_per_token,
                        "note": "in use after a run: prompt + new tokens - 1 (the last token is sampled, never run)",
                    },
                    "token_ids": s_runs[0]["token_ids"],
                    "greedy_repeatable": all(r["token_ids"] == s_runs[0]["token_ids"] for r in s_runs),
                }
            )
            rows.append(sdk_row)
            if genai is not None:
                g_row = _summarise(g_runs, P)
                g_row.update(
                    {
                        "variant": vid,
                        "runtime": "onnxruntime-genai",
                        "runtime_version": genai.version,
                        "backend": "onnxruntime (loaded by onnxruntime-genai)",
                        "threads": threads,
                        "allow_spinning": "genai's default",
                        "prompt_tokens": P,
                        "new_tokens": G,
                        "kv": {"allocated_tokens": P + G, "allocated_bytes": (P + G) * g.kv_bytes_per_token, "note": "max_length = P + G"},
                        "eos_token_id_set": genai_eos,
                        "load_ms": genai.load_ms,
                        "token_ids": g_runs[0]["token_ids"],
                    }
                )
                rows.append(g_row)
                diffs = [first_difference(a["token_ids"], b["token_ids"]) for a, b in zip(s_runs, g_runs)]
                bad = [d for d in diffs if d is not None]
                pos = bad[0] if bad else None
                first = s_runs[diffs.index(pos)] if pos is not None else None
                second = g_runs[diffs.index(pos)] if pos is not None else None
                comparisons.append(
                    {
                        "variant": vid,
                        "threads": threads,
                        "tokens_per_s_ratio": _ratio(sdk_row["tokens_per_s"], g_row["tokens_per_s"]),
                        "ttft_ratio": _ratio(sdk_row["ttft_ms"]["p50"], g_row["ttft_ms"]["p50"]),
                        "greedy_equal": not bad,
                        "runs_compared": len(diffs),
                        "runs_differing": len(bad),
                        "first_difference": None
                        if pos is None or first is None or second is None
                        else {
                            "position": pos,
                            "edge_sdk": first["token_ids"][pos] if pos < len(first["token_ids"]) else None,
                            "onnxruntime_genai": second["token_ids"][pos] if pos < len(second["token_ids"]) else None,
                        },
                        "order": "interleaved in one process: edge_sdk, genai, edge_sdk, genai, ...",
                    }
                )
            if opts.memory:
                children.append({"variant": vid, "threads": threads, "text": text, "ids": prompt_ids, "eos": genai_eos})
        finally:
            if genai is not None:
                genai.close()
            model.close()

    # -- peak RSS, one fresh child process per variant and runtime -----------------------------------------
    for c in children:
        for runtime in ("edge_sdk", "onnxruntime-genai") if opts.vs_raw else ("edge_sdk",):
            say(f"{c['variant']}: peak RSS of {runtime} in a child process")
            mem = measure_peak_rss(
                runtime, pkg.root, c["variant"], c["threads"], c["text"], c["ids"], opts.new_tokens,
                runs=2, context=opts.context, profile=opts.profile, root=opts.root, cache_dir=str(cache), genai_eos=c["eos"],
            )  # fmt: skip
            for r in rows:
                if r["variant"] == c["variant"] and r["runtime"] == runtime:
                    r["peak_rss"] = mem
                    if runtime == "edge_sdk":
                        budget = r["file_bytes"] + r["kv"]["allocated_bytes"] + 100 * MiB
                        r["rss_budget"] = {
                            "weights_plus_kv_plus_100mib_mb": budget / MiB,
                            "within": mem["peak_rss_mb"] is not None and mem["peak_rss_mb"] * MiB <= budget,
                        }

    this_peak, this_how = _peak_rss_mb()
    return {
        "schema": SCHEMA,
        "kind": "text-generation",
        "package": {"name": manifest.name, "version": manifest.version, "path": str(pkg.root)},
        "settings": {**opts.to_dict(), "greedy": True, "ignore_eos": True},
        "prompt": prompt_info,
        "environment": environment(
            started,
            _pc() - t_origin,
            detection.profile.name,
            cpu_before,
            _loadavg(),
            onnxruntime_genai=str(og.__version__) if opts.vs_raw else _version_of("onnxruntime_genai"),
        ),
        "peak_rss_this_process_mb": this_peak,
        "peak_rss_note": f"peak_rss per row: the peak RSS of a fresh child process running only that runtime (its 'source'); "
        f"peak_rss_this_process_mb: {this_how} of this process, every variant and runtime loaded in it",
        "rows": rows,
        "comparisons": comparisons,
        "warnings": warnings,
        "argv": list(argv) if argv is not None else None,
    }


def environment(
    started: _dt.datetime, wall_s: float, profile: str, cpu_before: dict[str, Any], loadavg_after: Any, **more: Any
) -> dict[str, Any]:
    """A report's ``environment``: when, how long, the platform, the versions, the profile, the CPU and
    its load average before and after (shared by the single-stream and the load benches)."""
    env: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "edge_sdk": __version__,
        "onnxruntime": _version_of("onnxruntime"),
        **more,
        "profile": profile,
        "cpu": cpu_before,
        "loadavg_before": cpu_before["loadavg"],
        "loadavg_after": loadavg_after,
    }
    return env


def _spinning(model: "DecoderModel") -> bool | None:
    sess = model._sess
    inner = getattr(sess, "_sess", None)
    if inner is None:
        return None
    v = inner.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
    return bool(v == "1")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else round(a / b, 4)


def _version_of(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module.replace("_", "-"))
    except Exception:  # not installed
        return None


# ------------------------------------------------------------------------------------------ peak RSS children


def measure_peak_rss(
    runtime: str,
    package: "str | os.PathLike[str]",
    variant: str,
    threads: int,
    text: str,
    ids: Sequence[int],
    new_tokens: int,
    *,
    runs: int = 2,
    context: int | None = None,
    profile: str | None = None,
    root: str = "/",
    cache_dir: str | None = None,
    genai_eos: int = -1,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Load ``variant`` with ``runtime`` ("edge_sdk" or "onnxruntime-genai") in a fresh child process,
    run ``runs`` generations of ``new_tokens`` after the prompt and return the child's
    peak RSS (VmHWM on Linux, else ``ru_maxrss``; MiB), its RSS before loading and after, and the load time. BenchError when the
    child fails."""
    if runtime not in ("edge_sdk", "onnxruntime-genai"):
        raise OptionsError(f"runtime: expected 'edge_sdk' or 'onnxruntime-genai', got {runtime!r}")
    spec = {
        "runtime": runtime, "package": str(package), "variant": variant, "threads": threads, "text": text, "ids": list(ids),
        "new_tokens": new_tokens, "runs": runs, "context": context, "profile": profile, "root": root, "cache_dir": cache_dir,
        "genai_eos": genai_eos,
    }  # fmt: skip
    cmd = [sys.executable, "-m", "edge_sdk.bench.generation", "--child", json.dumps(spec)]
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"peak RSS child ({runtime}, {variant}) ran past {timeout_s:.0f} s") from e
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        raise BenchError(f"peak RSS child ({runtime}, {variant}) failed (exit {p.returncode}): {p.stderr.strip()[-800:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    rss0 = _rss_now_mb()
    peak0, _ = _peak_rss_mb()
    t0 = _pc()
    ids: list[int] = [int(x) for x in spec["ids"]]
    G = int(spec["new_tokens"])
    tokens: list[int] = []
    if spec["runtime"] == "edge_sdk":
        from ..model import LoadOptions, load_decoder

        cache = Path(spec["cache_dir"]) if spec.get("cache_dir") else None
        opts = LoadOptions(variant=spec["variant"], threads=spec["threads"], cache_dir=cache, root=spec["root"], context=spec["context"])
        model = load_decoder(spec["package"], spec["profile"], opts)
        load_ms = (_pc() - t0) * 1e3
        rss1 = _rss_now_mb()
        for _ in range(int(spec["runs"])):
            tokens = list(model.generate(spec["text"], max_new_tokens=G, ignore_eos=True).token_ids)
        kv: int | None = model.context.kv_bytes
    else:
        from ..package import ModelPackage

        pkg = ModelPackage.open(spec["package"])
        gd = GenaiDecoder(pkg, pkg.manifest.variant(spec["variant"]), int(spec["threads"]), len(ids) + G, int(spec["genai_eos"]))
        load_ms = (_pc() - t0) * 1e3
        rss1 = _rss_now_mb()
        for _ in range(int(spec["runs"])):
            tokens = gd.generate(ids)["token_ids"]
        kv = None  # genai's buffer is not visible from here; the parent reports max_length x bytes per token
    peak, how = _peak_rss_mb()
    return {
        "runtime": spec["runtime"],
        "variant": spec["variant"],
        "threads": spec["threads"],
        "peak_rss_mb": peak,
        "source": f"{how} of a fresh child process running only this runtime",
        "peak_rss_before_load_mb": peak0,
        "rss_before_load_mb": rss0,
        "rss_after_load_mb": rss1,
        "rss_end_mb": _rss_now_mb(),
        "load_ms": load_ms,
        "generated_tokens": len(tokens),
        "kv_allocated_bytes": kv,
    }


# ------------------------------------------------------------------------------------------ text


def render_generation_text(report: dict[str, Any]) -> str:
    """The table the CLI prints."""
    env = report["environment"]
    cpu = env["cpu"]
    flags = ", ".join(k for k, v in cpu["flags"].items() if v) or "none of " + ", ".join(CPU_FLAGS)
    pr = report.get("prompt", {})
    lines = [
        f"edge-sdk bench (text generation): {report['package']['name']} {report['package']['version']}",
        f"cpu: {cpu['cpu_model'] or 'unknown'} x {cpu['cpu_count']} ({flags}); load average before {env['loadavg_before']}, "
        f"after {env['loadavg_after']}; onnxruntime {env['onnxruntime']}"
        + (f", onnxruntime-genai {env['onnxruntime_genai']}" if env.get("onnxruntime_genai") else ""),
        f"prompt: {pr.get('source', '?')}; {report['settings']['new_tokens']} new tokens, greedy, ignore_eos; "
        f"{report['settings']['runs']} runs (+{report['settings']['warmup']} warm-up) per runtime",
        "",
        f"{'variant':<10} {'runtime':<18} {'thr':>3} {'TTFT p50/p90/p99 ms':>22} {'TPOT p50/p90/p99 ms':>22} {'tok/s':>7} "
        f"{'prefill tok/s':>13} {'loop ms/tok':>11} {'peak RSS MiB':>12}",
    ]
    for r in report["rows"]:
        tt, tp = r["ttft_ms"], r["tpot_ms"]
        tps = f"{r['tokens_per_s']:.1f}" if r.get("tokens_per_s") else "-"
        tpot = f"{tp['p50']:.2f}/{tp['p90']:.2f}/{tp['p99']:.2f}" if tp else "-"
        ov = r.get("loop_overhead_ms_per_token")
        ovs = f"{ov['p50']:.3f}" if ov else "-"
        rss = (r.get("peak_rss") or {}).get("peak_rss_mb")
        rsss = f"{rss:.0f}" if rss is not None else "-"
        ttft = f"{tt['p50']:.1f}/{tt['p90']:.1f}/{tt['p99']:.1f}"
        lines.append(
            f"{r['variant']:<10} {r['runtime']:<18} {r['threads']:>3} {ttft:>22} {tpot:>22} {tps:>7} "
            f"{r['prefill_tokens_per_s'] or 0:>13.0f} {ovs:>11} {rsss:>12}"
        )
    for r in report["rows"]:
        if r["runtime"] == "edge_sdk":
            kv = r["kv"]
            b = r.get("rss_budget")
            lines.append(
                f"{r['variant']}: KV {kv['allocated_tokens']} tokens allocated ({kv['allocated_bytes'] / MiB:.1f} MiB), "
                f"{kv['in_use_tokens']} in use ({(kv['in_use_bytes'] or 0) / MiB:.2f} MiB) at {kv['bytes_per_token']} B/token; "
                f"weights {r['file_bytes'] / MiB:.1f} MiB, {r['weight_bytes_per_token'] / MiB:.1f} MiB read per token"
                + (
                    f"; peak RSS {r['peak_rss']['peak_rss_mb']:.0f} MiB vs weights + KV + 100 MiB = "
                    f"{b['weights_plus_kv_plus_100mib_mb']:.0f} MiB ({'within' if b['within'] else 'OVER'})"
                    if b
                    else ""
                )
            )
    for c in report["comparisons"]:
        fd = c["first_difference"]
        eq = (
            "equal"
            if c["greedy_equal"]
            else f"DIFFER from position {fd['position']} (edge_sdk {fd['edge_sdk']}, genai {fd['onnxruntime_genai']})"
        )
        lines.append(
            f"{c['variant']} vs onnxruntime-genai ({c['threads']} threads): tokens/s ratio {c['tokens_per_s_ratio']}, TTFT ratio "
            f"{c['ttft_ratio']}; greedy ids {eq} over {c['runs_compared']} runs"
        )
    for w in report["warnings"]:
        lines.append(f"warning: {w}")
    if report.get("peak_rss_this_process_mb") is not None:
        lines.append(f"peak RSS of this process (everything loaded in it): {report['peak_rss_this_process_mb']:.0f} MiB")
    return "\n".join(lines) + "\n"


def write_generation_json(report: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``report`` as JSON (NaN refused); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return p


def _main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "--child":
        print(json.dumps(_child(json.loads(argv[1]))), flush=True)
        return 0
    print("usage: python -m edge_sdk.bench.generation --child SPEC_JSON (internal: the peak-RSS child)", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover - the child process
    sys.exit(_main(sys.argv[1:]))
