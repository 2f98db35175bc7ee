"""``edge-sdk models``: list, install, activate, roll back and verify store contents.

    edge-sdk models list --store DIR [--json]
    edge-sdk models install PACKAGE --store DIR [--allow-downgrade] [--json]
    edge-sdk models activate NAME VERSION --store DIR [--json]
    edge-sdk models rollback NAME --store DIR [--json]
    edge-sdk models verify [NAME] --store DIR [--json]

Exit codes: 0 ok, 1 the update did not succeed / a version failed verification.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``edge-sdk models`` subcommands (list, install, activate, rollback, verify) to parser ``p``."""
    sub = p.add_subparsers(dest="models_cmd", required=True)

    def common(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument("--store", required=True, help="the store folder (created if missing)")
        q.add_argument("--json", action="store_true", help="print JSON instead of text")
        return q

    common(sub.add_parser("list", help="installed versions, which is active and which previous"))
    q = common(sub.add_parser("install", help="install a package folder or archive; it becomes active if it passes its health check"))
    q.add_argument("package")
    q.add_argument("--allow-downgrade", action="store_true", help="accept a version older than the active one")
    q = common(sub.add_parser("activate", help="make an installed version active (health-checked)"))
    q.add_argument("name")
    q.add_argument("version", help="a version or its folder name")
    q = common(sub.add_parser("rollback", help="switch back to the previous version"))
    q.add_argument("name")
    q = common(sub.add_parser("verify", help="re-check every digest and signature of installed versions"))
    q.add_argument("name", nargs="?")


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
    from .store import ModelStore

    store = ModelStore(args.store)
    cmd = args.models_cmd
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
