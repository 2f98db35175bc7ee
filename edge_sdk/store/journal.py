"""The store's update journal: an append-only, fsync'd JSON-lines file.

Each line is one record ``{"tx", "seq", "t", "kind", "model", "phase", ...}``.
A phase record is written (and fsync'd) *before* the step it names, so after a
power loss the last phase of an update says how far it may have got. An update
ends with exactly one record holding ``"terminal"``: ``succeeded``,
``rolled_back`` or ``failed_no_change`` (and a ``reason``). A torn last line
(power loss mid-append) is cut off when the journal is opened.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._fs import crash_point

TERMINAL_STATES = ("succeeded", "rolled_back", "failed_no_change")


@dataclass
class UpdateRecord:
    """Everything the journal says about one update (transaction)."""

    tx: str
    kind: str
    model: str
    phases: list[dict[str, Any]] = field(default_factory=list)
    terminals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last_phase(self) -> str | None:
        """The latest phase the update reached, or None."""
        return self.phases[-1]["phase"] if self.phases else None

    @property
    def terminal(self) -> str | None:
        """How the update ended (one of ``TERMINAL_STATES``), or None if it has not ended (still running, or interrupted)."""
        return self.terminals[-1]["terminal"] if self.terminals else None

    @property
    def reason(self) -> str:
        """Why the update ended as it did (empty if it has not ended)."""
        return str(self.terminals[-1].get("reason", "")) if self.terminals else ""

    def phase_data(self, phase: str) -> dict[str, Any]:
        """The record of ``phase`` (empty if the update never reached it)."""
        for r in self.phases:
            if r["phase"] == phase:
                return r
        return {}


class Journal:
    """Append-only JSON-lines journal at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._repair()
        self._seq = sum(1 for _ in self._lines())

    def _repair(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(cut)
                os.fsync(f.fileno())

    def _lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a torn line: the record was never durable
                continue
        return out

    def append(self, record: dict[str, Any]) -> None:
        """Append ``record`` (with a sequence number and time) as one JSON line, and fsync it before returning."""
        self._seq += 1
        rec = {"seq": self._seq, "t": round(time.time(), 3), **record}
        line = (json.dumps(rec, sort_keys=True) + "\n").encode()
        crash_point(f"journal {record.get('phase') or record.get('terminal')}")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            crash_point("journal fsync")
            os.fsync(fd)
        finally:
            os.close(fd)

    def phase(self, tx: str, kind: str, model: str, phase: str, **data: Any) -> None:
        """Record that update ``tx`` reached ``phase``."""
        self.append({"tx": tx, "kind": kind, "model": model, "phase": phase, **data})

    def terminal(self, tx: str, kind: str, model: str, state: str, reason: str = "", **data: Any) -> None:
        """Record how update ``tx`` ended: ``state`` is one of ``TERMINAL_STATES``."""
        assert state in TERMINAL_STATES, state
        self.append({"tx": tx, "kind": kind, "model": model, "terminal": state, "reason": reason, **data})

    def updates(self) -> dict[str, UpdateRecord]:
        """tx -> its record, in the order the updates began."""
        out: dict[str, UpdateRecord] = {}
        for r in self._lines():
            if "event" in r:  # start failures and other events: not part of an update
                continue
            u = out.setdefault(r["tx"], UpdateRecord(r["tx"], r.get("kind", ""), r.get("model", "")))
            u.model = r.get("model") or u.model
            (u.terminals if "terminal" in r else u.phases).append(r)
        return out

    def records(self) -> list[dict[str, Any]]:
        """Every record in the journal, in order (torn lines, never durable, are skipped)."""
        return self._lines()
