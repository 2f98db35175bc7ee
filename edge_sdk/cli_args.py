"""Argument helpers shared by the ``edge-sdk`` subcommands (``cli``) and the commands that own
their arguments (``serve``): the common options and how they become ``edge_sdk.load`` keywords.
Imports nothing of the SDK, so any command module can use it without importing ``cli``."""

from __future__ import annotations

import argparse
from typing import Any


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """``--profile`` and ``--root``: which device profile, and where /proc and /sys are read."""
    p.add_argument("--profile", help="device profile name or .toml path (default: $EDGE_SDK_PROFILE or detected)")
    p.add_argument("--root", default="/", help="read /proc and /sys from this root (default: /)")


def add_common(p: argparse.ArgumentParser) -> None:
    """``--profile``, ``--root`` and ``--json``: the options every device-facing subcommand takes."""
    add_device_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_load_arguments(p: argparse.ArgumentParser, *, result_cache: bool = False, variant_help: str = "force this variant id") -> None:
    """``--variant``, ``--threads``, ``--no-measure`` and the reproducibility options of a subcommand that loads a model."""
    p.add_argument("--variant", help=variant_help)
    p.add_argument("--threads", type=int, help="override the profile's thread count")
    p.add_argument("--no-measure", action="store_true", help="do not time tied backends; take the profile's order")
    add_repro_arguments(p, result_cache=result_cache)


def add_repro_arguments(p: argparse.ArgumentParser, *, result_cache: bool = True) -> None:
    """``--deterministic`` and, for ``predict``, ``--result-cache N`` (not for serve, whose workers
    run the session directly, nor demo, whose latency loop repeats one image)."""
    p.add_argument("--deterministic", action="store_true",
                   help="repeatable results: fixed threads (--threads, else 1) and the runtime's deterministic settings (docs/reproducibility.md)")  # fmt: skip
    if result_cache:
        p.add_argument("--result-cache", type=int, default=0, metavar="N",
                       help="keep the outputs of the last N distinct inputs and answer repeats from them (default 0: off)")  # fmt: skip


def load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``edge_sdk.load`` keyword arguments from the shared ``--root/--variant/--threads/--no-measure/--deterministic/--result-cache`` options."""
    kw: dict[str, Any] = {"root": args.root}
    if args.variant:
        kw["variant"] = args.variant
    if args.threads:
        kw["threads"] = args.threads
    if args.no_measure:
        kw["measure_backends"] = False
    if getattr(args, "deterministic", False):
        kw["deterministic"] = True
    if getattr(args, "result_cache", 0):
        kw["result_cache"] = args.result_cache
    return kw
