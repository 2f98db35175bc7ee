"""Train the tiny Llama-style decoder that ships as ``tools/fixtures/tiny_llm/`` (run once; torch only here).

Why: the generative path (converter -> ONNX graph -> runtime) needs a real pretrained decoder small
enough to live in the repository (a few MB) and to run in tests in well under a second, with a real
byte-level BPE tokenizer and a ChatML template. Its weights are written in Hugging Face's Llama
layout (https://huggingface.co/docs/transformers/model_doc/llama) so that any reader of a standard
Hugging Face folder (``config.json`` + ``model.safetensors`` + ``tokenizer.json``) reads it.

torch is used by THIS SCRIPT ONLY. It is never a dependency of ``edge_sdk``, the converters, the
tests or CI. Run it in a separate virtual environment (torch 2.13.0 is a CPU build)::

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 numpy safetensors tokenizers
    /tmp/torchvenv/bin/python tools/train_tiny_llm.py            # about 5 minutes on one core

Options: ``--steps N`` (default 600), ``--seed S`` (default 1234), ``--out DIR``
(default ``tools/fixtures/tiny_llm``).

Model: 4 layers, hidden 128, 4 query heads / 2 key-value heads (grouped-query attention),
head_dim 32, SwiGLU MLP (SiLU) with intermediate 384, RMSNorm (eps 1e-5), RoPE (theta 10000,
Hugging Face's half-split ``rotate_half`` convention, the one ONNX Runtime's GroupQueryAttention
uses with ``rotary_interleaved=0``), tied input/output embeddings, no biases, vocabulary 1024,
max_position_embeddings 512. Written in plain torch below (no ``transformers``); about 0.92 M
parameters. Embeddings (and every linear weight) are initialised N(0, 0.02): N(0, 1) embeddings tied
to the head start the loss near 181 nats.

Tokenizer: byte-level BPE trained with Hugging Face ``tokenizers``
(https://huggingface.co/docs/tokenizers/api/models#tokenizers.models.BPE) on the training split
only: the 256 byte symbols are the initial alphabet (so every string encodes, no unknown token,
and bytes >= 0x80 are tokens that are not valid UTF-8 on their own), 765 merges, and three added
special tokens ``<|endoftext|>`` (0, document separator, also BOS and pad), ``<|im_start|>`` (1),
``<|im_end|>`` (2, EOS: the end of a ChatML turn). ByteLevel pre-tokenizer with
``add_prefix_space=False``, ByteLevel decoder, no post-processor (nothing is added on encode).
``tokenizer_config.json`` carries SmolLM2's ChatML template.

Corpus: the documentation that ships with CPython (``pydoc_data.topics.topics``, topic -> text).
Split by topic: topics are ordered by the SHA-256 of their name and the first ones are held out
until the held-out text reaches 5 % of all characters; the rest train, minus every paragraph that
also occurs in a held-out topic (pydoc topics repeat each other verbatim: without this 86 % of the
held-out text was in the training text and the held-out loss read 2.2 instead of ~3). Training also gets a few
hand-written lines with non-ASCII characters (pydoc has curly quotes and dashes but few accented
letters and no emoji) and a short ChatML exchange per training topic (the user asks what the
documentation says about the topic, the assistant answers with the topic's first sentence(s)), so
the model has seen the chat format and ends turns with ``<|im_end|>``. Every document is prefixed
with ``<|endoftext|>``.

Training: one thread (``torch.set_num_threads(1)``), ``torch.manual_seed(seed)``, AdamW
(betas 0.9/0.95, weight decay 0.1 on matrices), linear warm-up then cosine learning rate
(peak 3e-3, floor 10 %), gradient clipping 1.0, dropout 0.1 (training only, on the embedding output
and both residual branches), batch 16 random windows of 256 tokens from the
training token stream. Held-out loss is the mean next-token cross-entropy (nats/token) over
consecutive 257-token windows of the held-out stream.

Writes into ``--out``: ``config.json``, ``generation_config.json``, ``model.safetensors`` (float32),
``tokenizer.json``, ``tokenizer_config.json``, ``heldout.txt`` (the held-out documentation text,
topics separated by blank lines), ``torch_reference.json`` (for three fixed prompts: prompt ids,
the greedy 20-token continuation of this torch model, computed with full recomputation and no
early stop at EOS, and the top-5 ids and float32 logits at the last prompt position, for comparing
an ONNX build) and ``TRAINING.json`` (seed, steps, hyper-parameters, loss curve, final train and
held-out loss, topic names of each split, torch/python versions, SHA-256 of every other file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn

ROOT = Path(__file__).resolve().parents[1]  # the repository root (this file is tools/train_tiny_llm.py)
DEFAULT_OUT = ROOT / "tools" / "fixtures" / "tiny_llm"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
    "use_cache": True,
}

SEQ_LEN = 256
BATCH = 16
PEAK_LR = 3e-3
WARMUP = 50
#: Training-only dropout on the embedding output and both residual branches (inference has none, so the
#: Hugging Face layout and any reader are unaffected); without it the model overfits the ~150 k-token corpus.
DROPOUT = 0.1
HELDOUT_FRACTION = 0.05

#: Lines with non-ASCII characters (accents, currency, dashes, umlauts, CJK, emoji: 2-, 3- and
#: 4-byte UTF-8), added to training so the model and tokenizer have seen multi-byte characters.
NON_ASCII_LINES = [
    "The café serves crème brûlée; the naïve résumé lists a façade in Besançon.",
    "Prices: 10 € for a ticket, 5 £ for a coffee, 300 ¥ for a snack — all approximate.",
    "Müller, Jürgen and Günther read über die Straße in Düsseldorf and Zürich.",
    "An em dash — like this — and an en dash: pages 10–20; an ellipsis… and “quotes”.",
    "Emoji in strings: 😀 🐍 🚀 ✨ 👍 are each one code point, encoded as four bytes in UTF-8.",
    'Python strings are Unicode: len("é") == 1, but "é".encode("utf-8") == b"\\xc3\\xa9".',
    "日本語のテキスト、中文文本 and Ελληνικά are also valid identifiers’ text in Python 3.",
    "Temperature 21 °C, angle 90°, micro µ, section §, copyright ©, registered ®.",
    'print("naïve café — 5 € 🐍") writes UTF-8 bytes when the locale encoding is UTF-8.',
    "Señor Peña’s jalapeño piñata costs 12,50 € in São Paulo; Ærø and Øresund are Danish.",
]

PROMPTS = [
    "The with statement",
    "def f(x):\n    return",
    "<|im_start|>user\nWhat does the documentation say about lambda?<|im_end|>\n<|im_start|>assistant\n",
]


# ----------------------------------------------------------------------------------------- corpus


def split_topics(topics: dict[str, str]) -> tuple[list[str], list[str]]:
    """(train names, held-out names): order by SHA-256 of the name, hold out the first topics
    until they reach HELDOUT_FRACTION of all characters."""
    total = sum(len(t) for t in topics.values())
    order = sorted(topics, key=lambda n: hashlib.sha256(n.encode("utf-8")).hexdigest())
    held: list[str] = []
    chars = 0
    for name in order:
        if chars >= HELDOUT_FRACTION * total:
            break
        held.append(name)
        chars += len(topics[name])
    train = sorted(n for n in topics if n not in held)
    return train, sorted(held)


def first_sentences(text: str, limit: int = 300) -> str:
    """The topic's opening prose, cut at a sentence end before ``limit`` characters."""
    flat = " ".join(text.split())
    cut = flat[:limit]
    dot = cut.rfind(". ")
    return cut[: dot + 1] if dot > 40 else cut


def chat_document(topic: str, text: str) -> str:
    return (
        f"<|im_start|>user\nWhat does the documentation say about {topic}?<|im_end|>\n"
        f"<|im_start|>assistant\n{first_sentences(text)}<|im_end|>\n"
    )


def _norm(paragraph: str) -> str:
    return " ".join(paragraph.split())


def dedup_train_text(topics: dict[str, str], train: list[str], held: list[str]) -> tuple[dict[str, str], int]:
    """Training topics' text without any paragraph that also occurs in a held-out topic.

    pydoc topics repeat each other (``compound`` contains the ``for``, ``while`` and ``with``
    sections verbatim, ``specialnames`` the ``numeric-types`` one): splitting by name alone left 86 % of
    the held-out characters in the training text. Paragraphs are blank-line separated and compared
    with whitespace collapsed. Returns (name -> text, characters removed)."""
    held_paras = {_norm(q) for n in held for q in topics[n].split("\n\n") if q.strip()}
    out: dict[str, str] = {}
    removed = 0
    for n in train:
        keep = []
        for q in topics[n].strip().split("\n\n"):
            if _norm(q) in held_paras:
                removed += len(q)
            else:
                keep.append(q)
        out[n] = "\n\n".join(keep)
    return out, removed


def build_documents(train_text: dict[str, str]) -> list[str]:
    docs = [t for t in train_text.values() if t.strip()]
    docs += [chat_document(n, t) for n, t in train_text.items() if t.strip()]
    docs += ["\n".join(NON_ASCII_LINES)] * 3
    return docs


# -------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    if tok.get_vocab_size() != CONFIG["vocab_size"]:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {CONFIG['vocab_size']}")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s!r} has id {tok.token_to_id(s)}, expected {i}")
    return tok


def encode_docs(tok: Tokenizer, docs: list[str]) -> np.ndarray:
    ids: list[int] = []
    for d in docs:
        ids.append(0)  # <|endoftext|> starts every document
        ids += tok.encode(d).ids
    return np.asarray(ids, dtype=np.int64)


# ------------------------------------------------------------------------------------------ model


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's half-split rotation: (x1, x2) -> (-x2, x1)."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        d, self.nh, self.nkv, self.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv  # HF repeat_kv: kv head j serves query heads j*rep .. j*rep+rep-1
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin), DROPOUT, self.training)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), DROPOUT, self.training)


class Backbone(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class TinyLlama(nn.Module):
    """Llama decoder; ``state_dict`` keys are Hugging Face's (``model.layers.0.self_attn.q_proj.weight`` ...)."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.model = Backbone(c)
        hd = c["head_dim"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        freqs = torch.outer(torch.arange(c["max_position_embeddings"], dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # half-split layout: [cos(f0..f15), cos(f0..f15)]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=c["initializer_range"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = F.dropout(self.model.embed_tokens(ids), DROPOUT, self.training)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x) @ self.model.embed_tokens.weight.T  # tied LM head


# --------------------------------------------------------------------------------------- training


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    p = (step - WARMUP) / max(1, steps - WARMUP)
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * p)))


@torch.no_grad()
def stream_loss(model: TinyLlama, ids: np.ndarray, max_windows: int | None = None) -> float:
    """Mean next-token loss (nats/token) over consecutive (SEQ_LEN + 1)-token windows."""
    model.eval()
    total, count = 0.0, 0
    n = (len(ids) - 1) // SEQ_LEN
    if max_windows is not None:
        n = min(n, max_windows)
    for w in range(n):
        chunk = torch.from_numpy(ids[w * SEQ_LEN : w * SEQ_LEN + SEQ_LEN + 1]).unsqueeze(0)
        logits = model(chunk[:, :-1])
        total += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
        count += SEQ_LEN
    model.train()
    return total / count


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@torch.no_grad()
def torch_reference(model: TinyLlama, tok: Tokenizer) -> dict[str, Any]:
    model.eval()
    out = []
    for p in PROMPTS:
        ids = tok.encode(p).ids
        logits = model(torch.tensor([ids]))[0, -1]
        top = torch.topk(logits, 5)
        seq = list(ids)
        for _ in range(20):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        gen = seq[len(ids) :]
        out.append(
            {
                "prompt": p,
                "prompt_ids": ids,
                "top5_ids_last_prompt_position": [int(i) for i in top.indices],
                "top5_logits_last_prompt_position": [float(v) for v in top.values],
                "greedy_20_ids": gen,
                "greedy_20_text": tok.decode(gen, skip_special_tokens=False),
            }
        )
    return {
        "note": "float32 torch model, full recomputation per step, no early stop at EOS; chat prompt is raw ChatML text",
        "prompts": out,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    from pydoc_data.topics import topics

    train_names, held_names = split_topics(topics)
    train_text, dedup_removed = dedup_train_text(topics, train_names, held_names)
    docs = build_documents(train_text)
    heldout_text = "\n\n".join(topics[n].strip() for n in held_names) + "\n"
    (out / "heldout.txt").write_text(heldout_text, encoding="utf-8")

    tok = train_tokenizer(docs)
    tok.save(str(out / "tokenizer.json"))
    train_ids = encode_docs(tok, docs)
    held_ids = np.asarray([0] + tok.encode(heldout_text).ids, dtype=np.int64)
    print(f"topics: {len(train_names)} train, {len(held_names)} held out {held_names}", flush=True)
    print(f"tokens: {len(train_ids)} train, {len(held_ids)} held out; tokenizer {time.time() - t0:.1f}s", flush=True)

    model = TinyLlama(CONFIG)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=PEAK_LR, betas=(0.9, 0.95)
    )
    init_held = stream_loss(model, held_ids, max_windows=4)
    print(f"params {n_params}; initial held-out loss {init_held:.3f}", flush=True)

    curve: list[dict[str, float]] = []
    bucket: list[float] = []
    t_train = time.time()
    for step in range(args.steps):
        starts = rng.integers(0, len(train_ids) - SEQ_LEN - 1, size=BATCH)
        batch = torch.from_numpy(np.stack([train_ids[s : s + SEQ_LEN + 1] for s in starts]))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bucket.append(loss.item())
        if (step + 1) % 50 == 0 or step + 1 == args.steps:
            point = {"step": step + 1, "train_loss_mean": float(np.mean(bucket)), "lr": lr_at(step, args.steps)}
            if (step + 1) % 100 == 0 or step + 1 == args.steps:
                point["heldout_loss"] = stream_loss(model, held_ids)
            curve.append(point)
            bucket = []
            extra = f" held-out {point['heldout_loss']:.3f}" if "heldout_loss" in point else ""
            print(f"step {step + 1}/{args.steps} train {point['train_loss_mean']:.3f}{extra} ({time.time() - t_train:.0f}s)", flush=True)
    train_seconds = time.time() - t_train

    final_train = stream_loss(model, train_ids, max_windows=64)
    final_held = stream_loss(model, held_ids)
    print(f"final: train {final_train:.3f} held-out {final_held:.3f} nats/token; {train_seconds:.0f}s", flush=True)

    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # safetensors writes 0600
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    gen_cfg = {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0, "do_sample": False, "max_new_tokens": 64}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        for i, s in enumerate(SPECIAL_TOKENS)
    }
    tok_cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONFIG["max_position_embeddings"],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "torch_reference.json").write_text(json.dumps(torch_reference(model, tok), indent=2, ensure_ascii=False) + "\n")

    files = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "heldout.txt",
        "torch_reference.json",
    ]
    record = {
        "script": "tools/train_tiny_llm.py",
        "command": "/tmp/torchvenv/bin/python tools/train_tiny_llm.py" + ("" if argv is None else " " + " ".join(argv)),
        "seed": args.seed,
        "steps": args.steps,
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "optimizer": {"name": "AdamW", "peak_lr": PEAK_LR, "warmup": WARMUP, "schedule": "cosine to 10%", "betas": [0.9, 0.95]},
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "dropout": DROPOUT,
        "threads": 1,
        "parameters": n_params,
        "tokens": {"train": int(len(train_ids)), "heldout": int(len(held_ids))},
        "initial_heldout_loss": init_held,
        "final_train_loss": final_train,
        "final_heldout_loss": final_held,
        "loss_unit": "nats/token",
        "loss_curve": curve,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.time() - t0, 1),
        "split": {
            "rule": "topics ordered by sha256(name); the first ones held out until >= 5% of characters",
            "train_topics": train_names,
            "heldout_topics": held_names,
            "dedup": "training topics' paragraphs that also occur in a held-out topic are removed from training",
            "dedup_removed_chars": dedup_removed,
            "heldout_chars": len(heldout_text),
        },
        "corpus": "pydoc_data.topics of CPython " + platform.python_version() + " + non-ASCII lines + one ChatML exchange per train topic",
        "versions": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "tokenizers": __import__("tokenizers").__version__,
            "safetensors": __import__("safetensors").__version__,
        },
        "sha256": {f: sha256(out / f) for f in files},
    }
    (out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out} in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
