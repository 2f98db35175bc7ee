"""The ``edge-sdk serve`` command (its arguments: :func:`edge_sdk.serve.options.add_arguments`).

Loads each package with :func:`edge_sdk.load` (profile, variant selection, validation; a
``text-generation`` package gives a DecoderModel, served over the OpenAI-compatible API and Triton's
generate extension), serves them under their manifest names until SIGINT / SIGTERM, then stops
(bounded) and closes the models.
Prints ``edge-sdk serve: listening on <url>`` on stdout once the server answers (with ``--port 0``
the URL has the port that was picked).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ..cli_args import load_kwargs
from ..errors import OptionsError
from .options import ServeOptions

__all__ = ["read_token", "run"]


def read_token(args: argparse.Namespace) -> str | None:
    """The bearer token from ``--token-env VAR`` or ``--token-file F`` (None: no auth)."""
    if args.token_env:
        token = os.environ.get(args.token_env, "").strip()
        if not token:
            raise OptionsError(f"--token-env {args.token_env}: the environment variable is not set or empty")
        return token
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
        if not token:
            raise OptionsError(f"--token-file {args.token_file}: the file is empty")
        return token
    return None


def _with_package_signature(m: Any, profile: Any, kw: dict[str, Any]) -> Any:
    """The served model's tensors are the package's (what a client reads from the same manifest, and what
    Triton-style clients send): when selection picked a variant with its own signature (a TFLite variant's
    NHWC image) and the caller did not force it, serve the best accepted variant that has the package's
    signature instead, and say so."""
    from ..model import Model, load

    if not isinstance(m, Model) or kw.get("variant") or m.variant.inputs is None and m.variant.outputs is None:
        return m
    man = m.manifest
    ok = [c for c in m.selection.candidates if c.accepted and man.variant(c.variant_id).inputs is None and man.variant(c.variant_id).outputs is None]
    if not ok:
        return m
    best = min(ok, key=lambda c: (c.measured_ms if c.measured_ms is not None else float("inf"), c.rank, c.variant_id))
    print(
        f"edge-sdk serve: {man.name}: selection picked {m.variant.id}, whose tensors differ from the package's; "
        f"serving {best.variant_id}, which has the package's signature (force one with --variant)",
        flush=True,
    )
    m.close()
    return load(m.package, profile, **dict(kw, variant=best.variant_id))


def run(args: argparse.Namespace) -> int:
    """Run ``edge-sdk serve`` with parsed arguments: load the packages, start the server and serve until SIGTERM or Ctrl-C;
    returns the exit status."""
    from ..model import Model, load
    from ..package import ModelPackage, default_cache_dir
    from . import Server

    if (args.tls_cert is None) != (args.tls_key is None):
        print("edge-sdk: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    options = ServeOptions(
        max_batch_size=args.max_batch,
        max_queue_delay_ms=args.max_delay_ms,
        queue_size=args.queue_size,
        timeout_s=args.timeout_s,
        token=read_token(args),
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kw = load_kwargs(args)
    context = getattr(args, "context", None)
    models: list[Any] = []
    try:
        for p in args.packages:
            pkg = ModelPackage.open(p, cache_dir=default_cache_dir())  # opened once: load() takes it as it is
            extra = {"context": context} if context and pkg.manifest.task == "text-generation" else {}
            m: Any = load(pkg, args.profile, **kw, **extra)
            m = _with_package_signature(m, args.profile, kw)
            if args.max_streams < 1:
                print(f"edge-sdk: --max-streams: expected an int >= 1, got {args.max_streams}", file=sys.stderr)
                return 2
            if not isinstance(m, Model) and args.max_streams > 1:
                # concurrent conversations: one engine owns the decode loop (continuous batching)
                from ..generation.engine import EngineOptions, GenerationEngine

                m = GenerationEngine(m, EngineOptions(max_streams=args.max_streams, queue_size=args.queue_size, speculative=args.speculative))
            models.append(m)
        server = Server(
            models, options, host=args.host, port=args.port, tls_cert=args.tls_cert, tls_key=args.tls_key, access_log=args.access_log
        )
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            server.start()
            for m in models:
                if isinstance(m, Model):
                    info = f"{m.manifest.name} {m.manifest.version}: variant {m.variant.id} on {m.session.info.backend}"
                else:
                    man = m.package.manifest
                    streams = f", {m.options.max_streams} streams" if hasattr(m, "options") else ""
                    info = (f"{man.name} {man.version}: text generation, variant {m.variant.id}, "
                            f"{m.max_context} KV tokens{streams} "
                            f"(/v1/chat/completions, /v1/completions, /v2/models/{man.name}/generate)")  # fmt: skip
                print(f"edge-sdk serve: {info}", flush=True)
            print(f"edge-sdk serve: listening on {server.url}" + (" (bearer token required)" if options.token else ""), flush=True)
            server.wait(stop)
        finally:
            server.stop()
            signal.signal(signal.SIGTERM, previous)
    finally:
        for m in models:
            m.close()
            inner = getattr(m, "model", None)  # an engine: close the model it ran on too
            if inner is not None:
                inner.close()
    return 0
