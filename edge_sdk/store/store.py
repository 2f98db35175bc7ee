"""A local model store: atomic installs, health-gated commits, rollback.

On-disk layout (``ModelStore(root)``)::

    root/store.toml                       operator config (StoreConfig): signatures, trusted keys, keep, ...
    root/journal.jsonl                    append-only, fsync'd update journal (see journal.py)
    root/.lock                            flock held by whoever changes the store
    root/staging/<tx>/                    an update's copy while it is made and verified (never read by runtimes)
    root/versions/<name>/<version>-<sha12>/  installed packages, immutable, each complete (moved in by one rename)
        .store-install.json               tx, install time, manifest sha256, signer (written before the rename)
    root/active/<name>.json               the pointer: active and previous version folders, start failures
    root/trash/                           folders being deleted (moved out by one rename, then removed)

Phases of an install (each journaled, and fsync'd, *before* it starts):
``begin`` -> ``copying`` (copy / safe-extract into staging, fsync every file) ->
``verifying`` (every digest, the signature, the downgrade rule) -> ``staging``
(rename into ``versions/``, fsync the folder) -> ``health`` (load + golden check
in a child process, bounded by time) -> ``switching`` (write the pointer:
temp + fsync + os.replace + fsync the folder) -> terminal ``succeeded``. A
failure before ``staging`` ends in ``failed_no_change``; a failed health check
removes the new folder and ends in ``rolled_back`` with the reason; the pointer
never names a version that has not passed its health check.

Crash semantics: opening a store resolves every update that has no terminal
record, from its last journaled phase, deterministically: before ``health`` ->
``failed_no_change`` (staging and any new folder removed); in ``health`` ->
``rolled_back`` ("interrupted", *not* counted as a model failure: the pointer
never moved); in ``switching`` -> the switch is completed, ``succeeded`` (the
health check had passed). Staging and trash leftovers are removed. So after any
crash the pointer names a complete, verified version, old or new, never a mix.

Crash-loop guard: :meth:`ModelStore.load_active` (or :meth:`record_start`)
counts consecutive start failures in the pointer; at ``max_start_failures`` the
store rolls back to the previous version (journaled as its own update). A start
killed by a power loss records nothing, so it is not counted.

Rollback attacks: a validly signed package whose version is older than the
highest version this store has ever made active (``root/highest/<name>.json``,
raised before each switch, never lowered; installed versions count too) is
refused unless ``allow_downgrade=True``.

Names: a model name (and a version) is used on disk as it is, never rewritten,
so two names never share a slot: anything outside :data:`NAME_FORM` (lower-case
ASCII) is refused with :class:`StoreNameError`.

Intake (see intake.py): a folder or archive is listed and checked before a byte
is copied: only regular files and folders, only the files the manifest names
(plus the manifest and its signature), each of its declared size, all within
``max_package_bytes``; files are read through descriptors that follow no link. After each successful
update, the newest ``keep`` versions are kept (never the active or previous one).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .. import _toml
from ..errors import EdgeSDKError
from ..package import ModelPackage
from ._fs import atomic_write, crash_point, fsync_dir, fsync_file, fsync_tree
from .health import HealthResult, run_health_check
from .intake import stage_package
from .journal import Journal, UpdateRecord
from .signing import verify_signature

CONFIG_NAME = "store.toml"
INSTALL_INFO = ".store-install.json"


class StoreError(EdgeSDKError):
    """A store operation cannot be done as asked (unknown model or version, no previous version, bad config)."""


class StoreNameError(StoreError):
    """A model name or version cannot be used as a store file name as it is (see :data:`NAME_FORM`)."""


NAME_FORM = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
VERSION_FORM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,63}")
_NAME_RULE = "1-64 characters: lower-case ASCII letters, digits, '.', '_', '-', starting with a letter or digit"
_VERSION_RULE = "1-64 characters: ASCII letters, digits, '.', '_', '+', '!', '-', starting with a letter or digit"


def check_model_name(name: object) -> str:
    """``name`` if the store can use it as a file name as it is; else :class:`StoreNameError` naming the allowed form."""
    if not isinstance(name, str) or not NAME_FORM.fullmatch(name):
        raise StoreNameError(f"model name {name!r} is not allowed in the store; expected {_NAME_RULE} (names are never rewritten)")
    return name


def check_version(version: object) -> str:
    """``version`` if the store can use it in a folder name as it is; else :class:`StoreNameError`."""
    if not isinstance(version, str) or not VERSION_FORM.fullmatch(version):
        raise StoreNameError(f"version {version!r} is not allowed in the store; expected {_VERSION_RULE}")
    return version


@dataclass(frozen=True)
class StoreConfig:
    """Operator settings, read from ``root/store.toml``.

    require_signatures: refuse unsigned packages. trusted_keys: Ed25519 public
    keys (64 hex digits) whose signatures are accepted. keep: installed versions
    kept per model (the active and previous ones are always kept). max_start_failures:
    consecutive failed starts before an automatic rollback. health_timeout_s: the
    health check's limit when the package's ``[golden]`` gives none.
    health_start_method: "spawn" (a fresh interpreter) or "fork" (faster).
    max_package_bytes: the most bytes an install copies into the store.
    refuse_unreferenced: refuse a package holding files its manifest does not
    name (by default they are not installed, and listed in ``UpdateResult.skipped``).
    """

    require_signatures: bool = False
    trusted_keys: tuple[str, ...] = ()
    keep: int = 3
    max_start_failures: int = 3
    health_timeout_s: float = 60.0
    health_start_method: str = "spawn"
    max_package_bytes: int = 8 * 1024**3
    refuse_unreferenced: bool = False

    def __post_init__(self) -> None:
        if self.keep < 2:
            raise StoreError(f"keep: at least 2 (the active and the previous version), got {self.keep}")
        if self.max_start_failures < 1 or self.health_timeout_s <= 0:
            raise StoreError("max_start_failures must be >= 1 and health_timeout_s > 0")
        if isinstance(self.max_package_bytes, bool) or not isinstance(self.max_package_bytes, int) or self.max_package_bytes <= 0:
            raise StoreError(f"max_package_bytes: expected a byte count > 0, got {self.max_package_bytes!r}")
        if self.health_start_method not in ("spawn", "fork"):
            raise StoreError(f"health_start_method: 'spawn' or 'fork', got {self.health_start_method!r}")
        for k in self.trusted_keys:
            if not re.fullmatch(r"[0-9a-f]{64}", k):
                raise StoreError(f"trusted_keys: expected 64 lower-case hex digits (an Ed25519 public key), got {k!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StoreConfig":
        """Parse the store's config file contents; :class:`StoreError` for an unknown key."""
        known = {f for f in cls.__dataclass_fields__}
        extra = sorted(set(d) - known)
        if extra:
            raise StoreError(f"{CONFIG_NAME}: unknown key(s) {extra}; allowed: {sorted(known)}")
        d = dict(d)
        if "trusted_keys" in d:
            d["trusted_keys"] = tuple(d["trusted_keys"])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """The config file form."""
        d = asdict(self)
        d["trusted_keys"] = list(self.trusted_keys)
        return d


@dataclass(frozen=True)
class UpdateResult:
    """How one update ended: ``state`` is a journal terminal state."""

    tx: str
    kind: str
    model: str
    state: str
    reason: str = ""
    version: str | None = None
    previous_version: str | None = None
    health: HealthResult | None = None
    skipped: tuple[str, ...] = ()  # files in the package the manifest does not name: not installed

    @property
    def ok(self) -> bool:
        """True if the update succeeded."""
        return self.state == "succeeded"


@dataclass(frozen=True)
class InstalledVersion:
    """One installed version of a model."""

    model: str
    version: str
    folder: str
    path: Path
    manifest_sha256: str
    signed_by: str | None
    installed_ns: int
    active: bool = False
    previous: bool = False


def version_key(v: str) -> tuple[Any, ...]:
    """Order versions: PEP 440 when ``packaging`` parses it, else the numbers in it."""
    try:
        from packaging.version import InvalidVersion, Version

        try:
            return (1, Version(v))
        except InvalidVersion:
            pass
    except ImportError:  # pragma: no cover
        pass
    return (0, tuple(int(x) for x in re.findall(r"\d+", v)))


def is_older(new: str, current: str) -> bool:
    """True if version ``new`` orders before ``current`` (PEP 440 where both parse, else by the numbers in them)."""
    a, b = version_key(new), version_key(current)
    if a[0] != b[0]:
        a, b = (0, tuple(int(x) for x in re.findall(r"\d+", new))), (0, tuple(int(x) for x in re.findall(r"\d+", current)))
    return bool(a < b)


@dataclass
class _Update:
    tx: str
    kind: str
    model: str = ""
    data: dict[str, Any] = field(default_factory=dict)


class ModelStore:
    """A store of installed model packages with an active pointer per model.

    Opening it takes the store lock and resolves any update a crash left
    mid-way (see the module docstring). ``config`` given: written to
    ``store.toml`` (atomically); else read from it (defaults when absent).
    """

    def __init__(self, root: str | os.PathLike[str], config: StoreConfig | None = None) -> None:
        self.root = Path(root)
        for sub in ("staging", "versions", "active", "trash", "highest"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if config is not None:
            atomic_write(self.root / CONFIG_NAME, _toml.dumps(config.to_dict()).encode())
            self.config = config
        elif (self.root / CONFIG_NAME).is_file():
            self.config = StoreConfig.from_dict(_toml.loads((self.root / CONFIG_NAME).read_text()))
        else:
            self.config = StoreConfig()
        with self._locked():
            self.journal = Journal(self.root / "journal.jsonl")
            self.recovered = self._recover()

    # -- locking and pointers ---------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _pointer_path(self, name: str) -> Path:
        return self.root / "active" / f"{check_model_name(name)}.json"

    def pointer(self, name: str) -> dict[str, Any] | None:
        """The active pointer of ``name``: {"active", "previous", "failures"} or None."""
        p = self._pointer_path(name)
        if not p.is_file():
            return None
        d = dict(json.loads(p.read_text()))
        if d.get("model") != name:
            raise StoreError(f"{p}: pointer of {d.get('model')!r} found where {name!r}'s was expected (store damaged?)")
        return d

    # -- the anti-rollback record ----------------------------------------------------

    def highest_version(self, name: str) -> str | None:
        """The highest version of ``name`` this store has made active (the record) or holds installed, or None."""
        p = self.root / "highest" / f"{check_model_name(name)}.json"
        seen = [str(json.loads(p.read_text())["version"])] if p.is_file() else []
        seen += [v.version for v in self.versions(name)]
        best: str | None = None
        for v in seen:
            if best is None or is_older(best, v):
                best = v
        return best

    def _raise_highest(self, name: str, version: str) -> None:
        cur = self.highest_version(name)
        if cur is None or is_older(cur, version) or cur == version:
            atomic_write(self.root / "highest" / f"{check_model_name(name)}.json", json.dumps({"model": name, "version": version}).encode())

    def _write_pointer(self, name: str, active: str | None, previous: str | None, failures: int = 0) -> None:
        p = self._pointer_path(name)
        if active is None:
            if p.exists():
                crash_point("unlink pointer")
                p.unlink()
                fsync_dir(p.parent)
            return
        atomic_write(p, json.dumps({"model": name, "active": active, "previous": previous, "failures": failures}).encode())

    def _versions_dir(self, name: str) -> Path:
        return self.root / "versions" / check_model_name(name)

    def active_path(self, name: str) -> Path | None:
        """The folder of the active version of ``name`` (what a runtime loads), or None."""
        ptr = self.pointer(name)
        return self._versions_dir(name) / ptr["active"] if ptr else None

    # -- listing ------------------------------------------------------------------

    def models(self) -> list[str]:
        """Names of the models with an active version, sorted."""
        return sorted(json.loads(p.read_text())["model"] for p in (self.root / "active").glob("*.json"))

    def versions(self, name: str | None = None) -> list[InstalledVersion]:
        """Installed versions (of ``name`` or all), newest install first per model."""
        out: list[InstalledVersion] = []
        base = self.root / "versions"
        dirs = [self._versions_dir(name)] if name else sorted(p for p in base.iterdir() if p.is_dir())
        for d in dirs:
            if not d.is_dir():
                continue
            rows = []
            for v in d.iterdir():
                info_p = v / INSTALL_INFO
                if not info_p.is_file():
                    continue
                info = json.loads(info_p.read_text())
                rows.append((info, v))
            model = rows[0][0]["model"] if rows else d.name
            ptr = self.pointer(model) or {}
            for info, v in sorted(rows, key=lambda r: -int(r[0]["installed_ns"])):
                out.append(
                    InstalledVersion(
                        model=info["model"], version=info["version"], folder=v.name, path=v, manifest_sha256=info["manifest_sha256"],
                        signed_by=info.get("signed_by"), installed_ns=int(info["installed_ns"]),
                        active=ptr.get("active") == v.name, previous=ptr.get("previous") == v.name,
                    )
                )  # fmt: skip
        return out

    def _find(self, name: str, version: str) -> InstalledVersion:
        for v in self.versions(name):
            if version in (v.version, v.folder):
                return v
        raise StoreError(f"{name} {version} is not installed (installed: {[v.version for v in self.versions(name)]})")

    def verify(self, name: str | None = None) -> list[tuple[InstalledVersion, str]]:
        """(version, "" or the error) for each installed version: every digest, the signature."""
        out = []
        for v in self.versions(name):
            try:
                ModelPackage.open(v.path)
                verify_signature(v.path, self.config.trusted_keys, required=self.config.require_signatures)
                out.append((v, ""))
            except EdgeSDKError as e:
                out.append((v, f"{type(e).__name__}: {e}"))
        return out

    # -- updates -------------------------------------------------------------------

    def _phase(self, u: _Update, phase: str, **data: Any) -> None:
        u.data.update(data)
        self.journal.phase(u.tx, u.kind, u.model, phase, **data)

    def _end(self, u: _Update, state: str, reason: str = "", health: HealthResult | None = None) -> UpdateResult:
        self.journal.terminal(u.tx, u.kind, u.model, state, reason, version=u.data.get("version"))
        skipped = tuple(u.data.get("skipped") or ())
        return UpdateResult(u.tx, u.kind, u.model, state, reason, u.data.get("version"), u.data.get("previous_version"), health, skipped)

    def install(self, source: str | os.PathLike[str], *, allow_downgrade: bool = False) -> UpdateResult:
        """Install a package folder or archive and make it active if it passes its
        health check. Always returns how the update ended (never half-done)."""
        with self._locked():
            u = _Update(uuid.uuid4().hex[:16], "install")
            self._phase(u, "begin", source=str(source))
            staging = self.root / "staging" / u.tx
            try:
                self._phase(u, "copying")
                pkg_dir, skipped = self._copy_in(Path(source), staging)
                self._phase(u, "verifying", skipped=skipped)
                pkg = ModelPackage.open(pkg_dir)
                signer = verify_signature(pkg_dir, self.config.trusted_keys, required=self.config.require_signatures)
                m = pkg.manifest
                u.model = check_model_name(m.name)
                check_version(m.version)
                ptr = self.pointer(m.name)
                cur = self._info(m.name, ptr["active"]) if ptr else None
                u.data.update(version=m.version, previous_version=cur["version"] if cur else None)
                if cur and cur["manifest_sha256"] == pkg.manifest_sha256:
                    shutil.rmtree(staging, ignore_errors=True)
                    return self._end(u, "failed_no_change", f"{m.name} {m.version} is already active")
                top = self.highest_version(m.name)
                if top and is_older(m.version, top) and not allow_downgrade:
                    shutil.rmtree(staging, ignore_errors=True)
                    active = f"; active: {cur['version']}" if cur else ""
                    return self._end(
                        u,
                        "failed_no_change",
                        f"downgrade refused: {m.version} is older than {top}, the highest version of {m.name} this store has "
                        f"installed{active}; expected a version >= {top} (or allow_downgrade=True / --allow-downgrade)",
                    )
            except (EdgeSDKError, OSError) as e:
                shutil.rmtree(staging, ignore_errors=True)
                return self._end(u, "failed_no_change", f"{type(e).__name__}: {e}")
            folder = f"{m.version}-{pkg.manifest_sha256[:12]}"
            dest = self._versions_dir(m.name) / folder
            is_new = not dest.exists()
            self._phase(u, "staging", version=m.version, folder=folder, new=is_new)
            if is_new:
                info = {"tx": u.tx, "model": m.name, "version": m.version, "manifest_sha256": pkg.manifest_sha256,
                        "signed_by": signer, "installed_ns": time.time_ns()}  # fmt: skip
                (pkg_dir / INSTALL_INFO).write_text(json.dumps(info))
                fsync_file(pkg_dir / INSTALL_INFO)
                fsync_dir(pkg_dir)
                dest.parent.mkdir(parents=True, exist_ok=True)
                crash_point("rename into versions")
                os.rename(pkg_dir, dest)
                fsync_dir(dest.parent)
            shutil.rmtree(staging, ignore_errors=True)
            return self._health_and_switch(u, m.name, folder, ptr, drop_on_failure=is_new)

    def _health_and_switch(self, u: _Update, name: str, folder: str, ptr: dict[str, Any] | None, *, drop_on_failure: bool) -> UpdateResult:
        dest = self._versions_dir(name) / folder
        self._phase(u, "health", folder=folder)
        pkg = ModelPackage.open(dest, verify=False)
        timeout = pkg.manifest.golden.timeout_s if pkg.manifest.golden else self.config.health_timeout_s
        health = run_health_check(dest, timeout, start_method=self.config.health_start_method)
        if not health.ok:
            self._phase(u, "rolling_back", reason=health.reason)
            if drop_on_failure:
                self._discard(dest)
            return self._end(u, "rolled_back", f"health check failed: {health.reason}", health)
        old_active = ptr["active"] if ptr else None
        old_prev = ptr["previous"] if ptr else None
        new_prev = old_active if old_active != folder else old_prev
        self._phase(u, "switching", folder=folder, old_active=old_active, old_previous=old_prev, new_previous=new_prev)
        self._raise_highest(name, pkg.manifest.version)
        self._write_pointer(name, folder, new_prev)
        res = self._end(u, "succeeded", "", health)
        self.gc(name, _locked=True)
        return res

    def activate(self, name: str, version: str) -> UpdateResult:
        """Make an installed version active, after it passes its health check."""
        with self._locked():
            v = self._find(name, version)
            u = _Update(uuid.uuid4().hex[:16], "activate", name, {"version": v.version})
            ptr = self.pointer(name)
            u.data["previous_version"] = self._info(name, ptr["active"])["version"] if ptr else None
            self._phase(u, "begin", version=v.version)
            self._phase(u, "verifying")
            try:
                ModelPackage.open(v.path)
                verify_signature(v.path, self.config.trusted_keys, required=self.config.require_signatures)
            except EdgeSDKError as e:
                return self._end(u, "failed_no_change", f"{type(e).__name__}: {e}")
            return self._health_and_switch(u, name, v.folder, ptr, drop_on_failure=False)

    def rollback(self, name: str, *, reason: str = "operator rollback", kind: str = "rollback") -> UpdateResult:
        """Switch back to the previous version (it passed its health check when it
        was made active, so none is run)."""
        with self._locked():
            return self._rollback(name, reason, kind)

    def _rollback(self, name: str, reason: str, kind: str) -> UpdateResult:
        ptr = self.pointer(name)
        if not ptr or not ptr.get("previous") or not (self._versions_dir(name) / ptr["previous"]).is_dir():
            raise StoreError(f"{name}: no previous version to roll back to")
        u = _Update(uuid.uuid4().hex[:16], kind, name)
        u.data.update(version=self._info(name, ptr["previous"])["version"], previous_version=self._info(name, ptr["active"])["version"])
        self._phase(u, "begin", reason=reason)
        self._phase(
            u, "switching", folder=ptr["previous"], old_active=ptr["active"], old_previous=ptr["previous"], new_previous=ptr["active"]
        )
        self._write_pointer(name, ptr["previous"], ptr["active"])
        return self._end(u, "rolled_back", reason)

    # -- the crash-loop guard --------------------------------------------------------

    def record_start(self, name: str, ok: bool, reason: str = "") -> UpdateResult | None:
        """Record whether the active version of ``name`` started; after
        ``max_start_failures`` failures in a row, roll back (returns that update)."""
        with self._locked():
            ptr = self.pointer(name)
            if ptr is None:
                raise StoreError(f"{name}: no active version")
            if ok:
                if ptr.get("failures"):
                    self._write_pointer(name, ptr["active"], ptr["previous"], 0)
                return None
            failures = int(ptr.get("failures", 0)) + 1
            self.journal.append(
                {"tx": "", "event": "start_failed", "model": name, "folder": ptr["active"], "failures": failures, "reason": reason}
            )
            if failures >= self.config.max_start_failures and ptr.get("previous"):
                return self._rollback(name, f"crash loop: {failures} failed starts in a row; last: {reason}", "crash_loop_rollback")
            self._write_pointer(name, ptr["active"], ptr["previous"], failures)
            return None

    def load_active(self, name: str, **load_options: Any) -> Any:
        """:func:`edge_sdk.load` the active version, counting failed starts
        (the crash-loop guard). Raises what ``load`` raised."""
        from ..model import load

        path = self.active_path(name)
        if path is None:
            raise StoreError(f"{name}: no active version")
        try:
            model = load(path, **load_options)
        except Exception as e:
            self.record_start(name, False, f"{type(e).__name__}: {e}")
            raise
        self.record_start(name, True)
        return model

    # -- garbage collection and recovery -----------------------------------------------

    def gc(self, name: str, *, _locked: bool = False) -> list[str]:
        """Remove all but the newest ``keep`` versions (never the active or previous)."""
        if not _locked:
            with self._locked():
                return self.gc(name, _locked=True)
        ptr = self.pointer(name) or {}
        protect = {ptr.get("active"), ptr.get("previous")}
        vs = self.versions(name)
        keep = {v.folder for v in vs[: self.config.keep]} | protect
        removed = []
        for v in vs:
            if v.folder not in keep:
                self._discard(v.path)
                removed.append(v.folder)
        return removed

    def _discard(self, path: Path) -> None:
        """Move a folder out of ``versions/`` in one rename, then delete it."""
        dest = self.root / "trash" / f"{path.name}-{uuid.uuid4().hex[:8]}"
        crash_point("rename to trash")
        os.rename(path, dest)
        fsync_dir(path.parent)
        shutil.rmtree(dest, ignore_errors=True)

    def _info(self, name: str, folder: str) -> dict[str, Any]:
        return dict(json.loads((self._versions_dir(name) / folder / INSTALL_INFO).read_text()))

    def _copy_in(self, source: Path, staging: Path) -> tuple[Path, list[str]]:
        staging.mkdir(parents=True)
        pkg_dir, skipped = stage_package(
            source, staging / "pkg", self.config.max_package_bytes, refuse_unreferenced=self.config.refuse_unreferenced
        )
        fsync_tree(staging)
        return pkg_dir, skipped

    def _recover(self) -> list[UpdateResult]:
        """Resolve updates a crash left without a terminal state (see module docstring)."""
        out = []
        for rec in self.journal.updates().values():
            if rec.terminals or not rec.phases:
                continue
            out.append(self._resolve(rec))
        for sub in ("staging", "trash"):
            for p in (self.root / sub).iterdir():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
        for p in (self.root / "active").glob(".*.tmp-*"):
            p.unlink()
        return out

    def _resolve(self, rec: UpdateRecord) -> UpdateResult:
        u = _Update(rec.tx, rec.kind, rec.model)
        for r in rec.phases:
            u.data.update({k: v for k, v in r.items() if k not in ("tx", "seq", "t", "kind", "model", "phase")})
            u.model = r.get("model") or u.model
        phase = rec.last_phase
        staged = rec.phase_data("staging")
        if phase == "switching":
            sw = rec.phase_data("switching")
            if rec.kind in ("install", "activate") and (self._versions_dir(u.model) / sw["folder"] / INSTALL_INFO).is_file():
                self._raise_highest(u.model, self._info(u.model, sw["folder"])["version"])
            self._write_pointer(u.model, sw["folder"], sw["new_previous"])
            state = "rolled_back" if rec.kind in ("rollback", "crash_loop_rollback") else "succeeded"
            return self._end(u, state, f"recovered after a crash: switch to {sw['folder']} completed")
        ptr = self.pointer(u.model) if u.model else None
        if staged and staged.get("new") and (not ptr or ptr.get("active") != staged["folder"]):
            dest = self._versions_dir(u.model) / staged["folder"]
            if dest.is_dir():
                self._discard(dest)
        if phase in ("health", "rolling_back"):
            why = u.data.get("reason") or "interrupted during the health check (updater killed; not counted as a model failure)"
            return self._end(u, "rolled_back", f"recovered after a crash: {why}")
        return self._end(u, "failed_no_change", f"recovered after a crash: interrupted in phase {phase!r}; nothing changed")
