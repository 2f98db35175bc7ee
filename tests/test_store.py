"""The model store: install, signatures, downgrade refusal, health-gated commit with
automatic rollback of bad versions, crash-loop guard, GC, journal, recovery, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from store_helpers import bad_op_onnx, make_pkg, slow_mlp_onnx

from edge_sdk.errors import IntegrityError
from edge_sdk.package import ModelPackage
from edge_sdk.store import ModelStore, StoreConfig, generate_keypair, sign_package
from edge_sdk.store.journal import TERMINAL_STATES

FAST = dict(health_start_method="fork", health_timeout_s=30.0)


def _store(root: Path, **kw: object) -> ModelStore:
    return ModelStore(root, StoreConfig(**{**FAST, **kw}))  # type: ignore[arg-type]


def _one_terminal_each(store: ModelStore) -> None:
    for u in store.journal.updates().values():
        assert len(u.terminals) == 1 and u.terminal in TERMINAL_STATES, u


def _active_version(store: ModelStore, name: str = "mlp") -> str:
    path = store.active_path(name)
    assert path is not None
    return ModelPackage.open(path).manifest.version


def test_install_then_upgrade_and_rollback(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    r1 = store.install(make_pkg(tmp_path / "v1", "1.0"))
    assert r1.ok and r1.health is not None and r1.health.ok, r1
    r2 = store.install(make_pkg(tmp_path / "v2", "1.1", seed=1))
    assert r2.ok and r2.previous_version == "1.0"
    assert _active_version(store) == "1.1"
    assert [v.version for v in store.versions("mlp")] == ["1.1", "1.0"]
    rb = store.rollback("mlp")
    assert rb.state == "rolled_back" and _active_version(store) == "1.0"
    assert store.activate("mlp", "1.1").ok and _active_version(store) == "1.1"
    assert all(not err for _v, err in store.verify())
    _one_terminal_each(store)
    # the journal survives a restart and nothing is left to recover
    again = ModelStore(tmp_path / "store")
    assert again.recovered == [] and len(again.journal.updates()) == 4


def test_install_archive(tmp_path: Path) -> None:
    import shutil

    src = make_pkg(tmp_path / "v1", "1.0")
    archive = shutil.make_archive(str(tmp_path / "v1pkg"), "zip", src)
    store = _store(tmp_path / "store")
    assert store.install(archive).ok and _active_version(store) == "1.0"


def test_bad_versions_are_rolled_back_with_reason(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    assert store.install(make_pkg(tmp_path / "good", "1.0")).ok
    # 1. bad digest: the model file changed after the manifest was written
    bad = make_pkg(tmp_path / "digest", "2.0")
    (bad / "m.onnx").write_bytes((bad / "m.onnx").read_bytes()[:-4] + b"\0\0\0\0")
    r = store.install(bad)
    assert r.state == "failed_no_change" and "IntegrityError" in r.reason and "sha256" in r.reason
    # 2. crashes on load: an op the runtime does not have
    r = store.install(make_pkg(tmp_path / "crash", "2.1", model=bad_op_onnx(), golden=False))
    assert r.state == "rolled_back" and "load/run failed" in r.reason, r
    # 3. wrong outputs versus golden
    r = store.install(make_pkg(tmp_path / "wrong", "2.2", seed=3, expected_seed=4))
    assert r.state == "rolled_back" and "golden: output 'y' differs" in r.reason, r
    # 4. really slower: the same function plus a chain of big MatMuls (same golden outputs), over a
    # latency bound that the good version meets with a wide margin (checked first, with that bound)
    assert store.install(make_pkg(tmp_path / "fast", "1.5", max_latency_ms=1.0)).ok
    assert store.rollback("mlp").state == "rolled_back" and _active_version(store) == "1.0"
    r = store.install(make_pkg(tmp_path / "slow", "2.3", model=slow_mlp_onnx(), max_latency_ms=1.0))
    assert r.state == "rolled_back" and "latency" in r.reason and "max_latency_ms" in r.reason, r
    assert _active_version(store) == "1.0"
    assert sorted(v.version for v in store.versions("mlp")) == ["1.0", "1.5"]  # failed versions are not kept
    _one_terminal_each(store)
    reasons = [u.reason for u in store.journal.updates().values() if u.terminal == "rolled_back"]
    assert len(reasons) == 4 and all(reasons)  # crash, wrong outputs, operator rollback, too slow


def test_health_check_timeout_and_child_crash(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", health_timeout_s=0.001)
    r = store.install(make_pkg(tmp_path / "v1", "1.0", golden=False))
    assert r.state == "rolled_back" and "timed out" in r.reason
    store2 = ModelStore(tmp_path / "store2", StoreConfig(health_start_method="spawn"))
    r = store2.install(make_pkg(tmp_path / "crash", "1.0", model=bad_op_onnx(), golden=False))
    assert r.state == "rolled_back" and "load/run failed" in r.reason


def test_signatures(tmp_path: Path) -> None:
    priv, pub = generate_keypair()
    other_priv, _other_pub = generate_keypair()
    store = _store(tmp_path / "store", require_signatures=True, trusted_keys=(pub,))
    unsigned = make_pkg(tmp_path / "unsigned", "1.0")
    r = store.install(unsigned)
    assert r.state == "failed_no_change" and "unsigned" in r.reason
    wrong = make_pkg(tmp_path / "wrong", "1.0")
    sign_package(wrong, other_priv)
    r = store.install(wrong)
    assert r.state == "failed_no_change" and "does not verify" in r.reason
    tampered = make_pkg(tmp_path / "tampered", "1.0")
    sign_package(tampered, priv)
    mf = tampered / "edge-model.toml"
    mf.write_text(mf.read_text().replace('version = "1.0"', 'version = "9.0"'))
    r = store.install(tampered)
    assert r.state == "failed_no_change" and "does not verify" in r.reason
    good = make_pkg(tmp_path / "good", "1.0")
    sign_package(good, priv)
    r = store.install(good)
    assert r.ok, r
    assert store.versions("mlp")[0].signed_by == pub
    assert store.verify() and all(not err for _v, err in store.verify())


def test_downgrade_refused_unless_allowed(tmp_path: Path) -> None:
    priv, pub = generate_keypair()
    store = _store(tmp_path / "store", require_signatures=True, trusted_keys=(pub,))
    for v in ("1.0", "2.0"):
        sign_package(make_pkg(tmp_path / v, v), priv)
    assert store.install(tmp_path / "2.0").ok
    r = store.install(tmp_path / "1.0")
    assert r.state == "failed_no_change" and "downgrade refused" in r.reason
    assert _active_version(store) == "2.0"
    assert store.install(tmp_path / "1.0", allow_downgrade=True).ok
    assert _active_version(store) == "1.0"
    assert store.install(tmp_path / "1.0").state == "failed_no_change"  # already active


def test_gc_keeps_k(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", keep=3)
    for i in range(6):
        assert store.install(make_pkg(tmp_path / f"v{i}", f"1.{i}", golden=False)).ok
    assert [v.version for v in store.versions("mlp")] == ["1.5", "1.4", "1.3"]
    # after a rollback the previous (older) one is protected even beyond K
    store.rollback("mlp")
    assert store.install(make_pkg(tmp_path / "v9", "1.9", golden=False)).ok
    kept = {v.version for v in store.versions("mlp")}
    assert kept == {"1.9", "1.4", "1.5"} and store.pointer("mlp")["previous"].startswith("1.4")  # type: ignore[index]


def test_recovery_resolves_midway_updates(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    assert store.install(make_pkg(tmp_path / "v1", "1.0", golden=False)).ok
    j = store.journal
    j.phase("aaa", "install", "mlp", "begin")
    j.phase("aaa", "install", "mlp", "copying")
    (tmp_path / "store" / "staging" / "aaa").mkdir()
    j.phase("bbb", "install", "mlp", "health", folder="nope")
    again = ModelStore(tmp_path / "store")
    states = {r.tx: r.state for r in again.recovered}
    assert states == {"aaa": "failed_no_change", "bbb": "rolled_back"}
    assert "not counted as a model failure" in next(r.reason for r in again.recovered if r.tx == "bbb")
    assert not any((tmp_path / "store" / "staging").iterdir())
    _one_terminal_each(again)
    # a torn journal tail (power loss mid-append) is cut off
    with open(tmp_path / "store" / "journal.jsonl", "a") as f:
        f.write('{"tx": "torn", "pha')
    again = ModelStore(tmp_path / "store")
    assert "torn" not in again.journal.updates()
    _one_terminal_each(again)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edge_sdk.cli import main

    store = tmp_path / "store"
    _store(store)  # writes store.toml (fork health checks)
    assert main(["models", "install", str(make_pkg(tmp_path / "v1", "1.0")), "--store", str(store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "succeeded"
    assert main(["models", "install", str(make_pkg(tmp_path / "v2", "2.0")), "--store", str(store)]) == 0
    assert capsys.readouterr().out.startswith("succeeded")
    assert main(["models", "list", "--store", str(store), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["active"], r["previous"]) for r in rows] == [("2.0", True, False), ("1.0", False, True)]
    assert main(["models", "rollback", "mlp", "--store", str(store)]) == 0
    assert "rolled_back" in capsys.readouterr().out
    assert main(["models", "activate", "mlp", "2.0", "--store", str(store)]) == 0
    assert main(["models", "verify", "--store", str(store), "--json"]) == 0
    assert all(r["ok"] for r in json.loads(capsys.readouterr().out.split("\n", 1)[1]))
    assert main(["models", "install", str(make_pkg(tmp_path / "v0", "0.5")), "--store", str(store)]) == 1


def test_crash_loop_guard(tmp_path: Path) -> None:
    """Runs last: it loads models in this process (fork health checks must come before)."""
    store = _store(tmp_path / "store", max_start_failures=3)
    assert store.install(make_pkg(tmp_path / "v1", "1.0", golden=False)).ok
    assert store.install(make_pkg(tmp_path / "v2", "2.0", golden=False, seed=2)).ok
    assert store.record_start("mlp", False, "boom") is None
    assert store.record_start("mlp", True) is None and store.pointer("mlp")["failures"] == 0  # type: ignore[index]
    assert store.record_start("mlp", False, "boom 1") is None
    assert store.record_start("mlp", False, "boom 2") is None
    r = store.record_start("mlp", False, "boom 3")
    assert r is not None and r.kind == "crash_loop_rollback" and "3 failed starts" in r.reason
    assert _active_version(store) == "1.0"
    # a start killed by a power loss records nothing; a real load counts as a good start
    with store.load_active("mlp") as m:
        assert m.manifest.version == "1.0"
    # a version whose file breaks after install fails to start: counted
    path = store.active_path("mlp")
    assert path is not None
    (path / "m.onnx").write_bytes(b"garbage")
    with pytest.raises(IntegrityError):
        store.load_active("mlp")
    assert store.pointer("mlp")["failures"] == 1  # type: ignore[index]
    _one_terminal_each(store)


def test_golden_manifest_section(tmp_path: Path) -> None:
    from edge_sdk import _toml
    from edge_sdk.errors import ManifestError
    from edge_sdk.package import Manifest

    pkg = make_pkg(tmp_path / "v1", "1.0", max_latency_ms=20)
    m = ModelPackage.open(pkg).manifest
    assert m.golden is not None and m.golden.max_latency_ms == 20.0 and m.golden.inputs == "golden_in.npz"
    assert Manifest.from_dict(_toml.loads(m.to_toml())) == m
    bad = _toml.loads(m.to_toml())
    bad["golden"]["max_latency"] = 3  # a typo is refused, like everywhere in the manifest
    with pytest.raises(ManifestError, match="unknown key"):
        Manifest.from_dict(bad)
    bad = _toml.loads(m.to_toml())
    bad["golden"]["inputs"] = "../x.npz"
    with pytest.raises(Exception, match="escape"):
        Manifest.from_dict(bad)
    (pkg / "golden_out.npz").write_bytes(b"PK not the expected outputs")  # golden files are covered by digest
    with pytest.raises(IntegrityError, match="golden outputs"):
        ModelPackage.open(pkg)


def test_health_child_abort_and_hang_do_not_take_the_updater_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork-mode child runs the (patched) check: a runtime that aborts, and one that hangs."""
    import os
    import time

    from edge_sdk.store import health

    store = _store(tmp_path / "store", health_timeout_s=2.0)
    monkeypatch.setattr(health, "check_package", lambda _p: os.abort())
    r = store.install(make_pkg(tmp_path / "v1", "1.0", golden=False))
    assert r.state == "rolled_back" and "crashed (killed by signal 6)" in r.reason, r
    monkeypatch.setattr(health, "check_package", lambda _p: time.sleep(60))
    t0 = time.monotonic()
    r = store.install(make_pkg(tmp_path / "v1", "1.0", golden=False))
    assert r.state == "rolled_back" and "timed out after 2 s" in r.reason and time.monotonic() - t0 < 10
    assert store.active_path("mlp") is None and store.versions() == []
