"""``edge-sdk generate`` and ``edge-sdk chat``: text generation from a decoder package.

    edge-sdk generate PKG --prompt TEXT [--max-tokens N] [--temperature T --top-k K --top-p P --min-p P
                      --repetition-penalty R --seed S] [--stop S ...] [--deadline-s S] [--truncate] [--json]
    edge-sdk chat PKG [--system TEXT] [same sampling options]

``generate`` streams the text to stdout as it is made (``--json``: one object at the end instead,
with ``text``, ``token_ids``, ``finish_reason``, ``prompt_tokens``, ``generated_tokens``, ``ttft_ms``,
``tpot_ms``, ``tokens_per_s``, ``variant`` and the rest of :meth:`GenerationResult.to_dict`). ``chat``
reads one user message per line from stdin (an empty line or EOF ends it), renders the conversation
with the package's chat template and streams each answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any, Callable

from ..cli_args import add_device_arguments, load_kwargs

__all__ = ["add_chat_arguments", "add_generate_arguments", "decoder_load_kwargs", "run_chat", "run_generate"]


def _sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256, help="new tokens at most (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability (0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1: off)")
    p.add_argument("--seed", type=int, help="seed for sampling (repeatable output)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--deadline-s", type=float, help="stop after this many seconds")
    p.add_argument("--context", type=int, help="KV tokens to allocate (default: from the memory budget)")
    p.add_argument("--variant", help="force this variant id")
    p.add_argument("--threads", type=int, help="override the profile's thread count")
    p.add_argument("--deterministic", action="store_true", help="repeatable results (docs/generation.md#determinism)")
    add_device_arguments(p)


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    """The ``generate`` subcommand's arguments."""
    p.add_argument("package", help="a text-generation package folder (or a .zip/.tar of one)")
    p.add_argument("--prompt", required=True, help="the prompt text ('-' reads it from stdin)")
    p.add_argument("--chat", action="store_true", help="send the prompt as one user message through the chat template")
    p.add_argument("--truncate", action="store_true", help="drop the prompt's oldest tokens if it does not fit the KV budget")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming text")
    _sampling_arguments(p)


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    """The ``chat`` subcommand's arguments."""
    p.add_argument("package", help="a text-generation package folder (or a .zip/.tar of one) with a chat template")
    p.add_argument("--system", help="a system message first")
    _sampling_arguments(p)


def decoder_load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``load_decoder`` keywords from the parsed options."""
    args.no_measure = False
    kw = load_kwargs(args)
    if args.context:
        kw["context"] = args.context
    return kw


def _gen_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_new_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "seed": args.seed,
        "stop": args.stop,
        "deadline_s": args.deadline_s,
    }


def _stream(stream: Any, out: IO[str]) -> Any:
    for delta in stream:
        out.write(delta)
        out.flush()
    return stream.result


def run_generate(model: Any, args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``edge-sdk generate`` on a loaded :class:`~edge_sdk.generation.DecoderModel` (closed at the end)."""
    out = out or sys.stdout
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    with model:
        p: Any = [{"role": "user", "content": prompt}] if args.chat else prompt
        stream = model.stream(p, truncate=args.truncate, **_gen_kwargs(args))
        if args.json:
            result = stream.until_done()
            out.write(json.dumps(result.to_dict(), indent=2) + "\n")
        else:
            result = _stream(stream, out)
            t = result.timings
            tps = f"{t.tokens_per_s:.1f} tok/s" if t.tokens_per_s else "-"
            print(
                f"\n[{result.usage.completion_tokens} tokens, {result.finish_reason}; TTFT {t.ttft_ms:.0f} ms, {tps}; {result.variant}]",
                file=sys.stderr,
            )
    return 0


def run_chat(
    model: Any, args: argparse.Namespace, inp: IO[str] | None = None, out: IO[str] | None = None, prompt: Callable[[str], None] | None = None
) -> int:
    """``edge-sdk chat`` on a loaded model: one user message per line; an empty line or EOF ends it."""
    inp = inp or sys.stdin
    out = out or sys.stdout
    show = prompt or (lambda s: (sys.stderr.write(s), sys.stderr.flush()))
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    with model:
        while True:
            show("> ")
            line = inp.readline()
            if not line or not line.strip():
                break
            messages.append({"role": "user", "content": line.rstrip("\n")})
            result = _stream(model.stream(messages, **_gen_kwargs(args)), out)
            out.write("\n")
            out.flush()
            messages.append({"role": "assistant", "content": result.text})
    return 0
