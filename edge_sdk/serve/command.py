"""The ``edge-sdk serve`` command (its arguments: :func:`edge_sdk.serve.options.add_arguments`).

Loads each package with :func:`edge_sdk.load` (profile, variant selection, validation), serves them
under their manifest names until SIGINT / SIGTERM, then stops (bounded) and closes the models.
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


def run(args: argparse.Namespace) -> int:
    """Run ``edge-sdk serve`` with parsed arguments: load the packages, start the server and serve until SIGTERM or Ctrl-C;
    returns the exit status."""
    from ..model import load_model
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
    models = []
    try:
        for p in args.packages:
            models.append(load_model(p, args.profile, **kw))
        server = Server(
            models, options, host=args.host, port=args.port, tls_cert=args.tls_cert, tls_key=args.tls_key, access_log=args.access_log
        )
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            server.start()
            for m in models:
                info = f"{m.manifest.name} {m.manifest.version}: variant {m.variant.id} on {m.session.info.backend}"
                print(f"edge-sdk serve: {info}", flush=True)
            print(f"edge-sdk serve: listening on {server.url}" + (" (bearer token required)" if options.token else ""), flush=True)
            server.wait(stop)
        finally:
            server.stop()
            signal.signal(signal.SIGTERM, previous)
    finally:
        for m in models:
            m.close()
    return 0
