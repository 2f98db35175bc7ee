"""The opt-in result cache (``LoadOptions(result_cache=N)``, edge_sdk/result_cache.py) with real
ONNX Runtime sessions: hits skip the model (seen in the model's own telemetry, not by timing),
one changed byte misses, variants key apart, stateful models and streams are refused, the LRU is
bounded, hits never hand out a writable shared array, counters reach /metrics over real HTTP."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_manifest, mlp_onnx

import edge_sdk
from edge_sdk import cli, errors, telemetry
from edge_sdk.result_cache import ResultCache, key_prefix

PROFILE = "generic-x86_64"


def _x(seed: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)


def _counts(m: edge_sdk.Model) -> tuple[int, int]:
    """(inference-stage records, total-stage records) of the model's telemetry."""
    h = m.telemetry.histograms
    return h["inference"].count, h["total"].count


@pytest.fixture
def fresh_mlp(mlp_package: Path):
    """The mlp package loaded with a 4-entry cache, its telemetry series started from zero."""
    m = edge_sdk.load(mlp_package, PROFILE, result_cache=4)
    telemetry.forget_model(m)
    m.close()
    m = edge_sdk.load(mlp_package, PROFILE, result_cache=4)
    yield m
    m.close()


def test_repeat_is_a_hit_and_skips_the_model(fresh_mlp: edge_sdk.Model) -> None:
    m = fresh_mlp
    x = _x(1)
    r1 = m.predict(x)
    assert not r1.cached and r1.timings.inference_ms > 0
    assert _counts(m) == (1, 1)
    r2 = m.predict(x.copy())  # equal bytes, another array
    assert r2.cached and r2.to_dict()["cached"] is True and "cached" not in r1.to_dict()
    assert r2.timings.inference_ms == 0.0
    assert _counts(m) == (1, 2)  # the call is counted; the inference stage did not run
    np.testing.assert_array_equal(r2.outputs["y"], r1.outputs["y"])
    assert m.result_cache.stats()[:4] == (1, 1, 0, 1)
    assert m.telemetry.result_cache == {"hits": 1, "misses": 1, "hit_rate": 0.5}
    assert m.describe()["result_cache"]["hits"] == 1


def test_one_changed_byte_misses(fresh_mlp: edge_sdk.Model) -> None:
    m = fresh_mlp
    x = _x(2)
    m.predict(x)
    y = x.copy()
    y.reshape(-1).view(np.uint8)[4] ^= 1  # one bit of one byte (float 1's low mantissa byte on little-endian)
    assert not np.array_equal(x, y) and np.allclose(x, y)
    r = m.predict(y)
    assert not r.cached
    assert _counts(m) == (2, 2)
    assert m.result_cache.key({"x": x}) != m.result_cache.key({"x": y})
    # dtype and shape are in the key too: the same bytes as another shape is another input
    assert m.result_cache.key({"x": _x(3, 2)}) != m.result_cache.key({"x": _x(3, 2).reshape(1, 16)})
    assert m.predict(x).cached and m.predict(y).cached


def test_hits_never_share_a_writable_array(fresh_mlp: edge_sdk.Model) -> None:
    m = fresh_mlp
    x = _x(4)
    r1 = m.predict(x)
    want = np.array(r1.outputs["y"])
    r1.outputs["y"][...] = 1234.0  # the miss hands back the runtime's own array: the caller may write it
    r2 = m.predict(x)
    assert r2.cached
    np.testing.assert_array_equal(r2.outputs["y"], want)  # the cache kept its own copy
    assert not r2.outputs["y"].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        r2.outputs["y"][0, 0] = 0.0
    r2.outputs.clear()  # the outputs dict is the caller's own too
    assert m.predict(x).outputs["y"].shape == want.shape


def test_variants_and_models_key_apart(demo_package: Path) -> None:
    feeds = {"image": np.zeros((1, 3, 32, 32), np.float32)}
    with (
        edge_sdk.load(demo_package, PROFILE, variant="fp32-onnx", result_cache=2) as a,
        edge_sdk.load(demo_package, PROFILE, variant="int8-onnx", result_cache=2) as b,
    ):
        assert a.result_cache.key(feeds) != b.result_cache.key(feeds)
    # each part of the fixed prefix matters: digest, variant id, I/O mode, preprocessing
    specs = a.inputs
    base = key_prefix("ab" * 32, "v", specs, False)
    assert base != key_prefix("cd" * 32, "v", specs, False)
    assert base != key_prefix("ab" * 32, "w", specs, False)
    assert base != key_prefix("ab" * 32, "v", specs, True)
    import dataclasses

    other = (dataclasses.replace(specs[0], preprocess=dataclasses.replace(specs[0].preprocess, mean=(0.4, 0.5, 0.5))),)
    assert base != key_prefix("ab" * 32, "v", other, False)


def test_predict_image_hits_and_decodes_with_the_calls_top_k(demo_package: Path) -> None:
    img = demo_package.parent / "samples" / "square_1.png"
    with edge_sdk.load(demo_package, PROFILE, variant="fp32-onnx", result_cache=8) as m:
        r1 = m.predict_image(img)
        r2 = m.predict_image(img, top_k=1)
        assert not r1.cached and r2.cached
        assert r2.timings.preprocess_ms > 0 and r2.timings.inference_ms == 0.0
        assert len(r1.decoded[0]) == 3 and len(r2.decoded[0]) == 1  # decoded again, with this call's top_k
        assert r2.top1 == r1.top1 and r2.top1.label == "square"


def test_lru_is_bounded_and_keeps_the_recent(mlp_package: Path) -> None:
    with edge_sdk.load(mlp_package, PROFILE, result_cache=2) as m:
        a, b, c = _x(10), _x(11), _x(12)
        m.predict(a)
        m.predict(b)
        assert m.predict(a).cached  # a is now the most recent
        m.predict(c)  # evicts b, the least recently used
        s = m.result_cache.stats()
        assert (s.size, s.capacity, s.evictions) == (2, 2, 1)
        assert m.predict(a).cached and m.predict(c).cached
        assert not m.predict(b).cached
        assert len(m.result_cache) == 2 and m.result_cache.stats().evictions == 2


def test_refused_for_stateful_models_and_streams(tmp_path: Path, mlp_package: Path) -> None:
    from onnx import TensorProto, helper

    from converters.packaging import write_package

    g = helper.make_graph(
        [helper.make_node("Add", ["x", "h_in"], ["y"]), helper.make_node("Identity", ["y"], ["h_out"])],
        "acc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]), helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]), helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 4])],
    )
    onx = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onx.ir_version = 8
    t = {"dtype": "float32", "shape": [1, 4]}
    write_package(
        tmp_path / "acc",
        {
            "name": "acc",
            "version": "1",
            "task": "raw",
            "inputs": [dict(t, name="x"), dict(t, name="h_in")],
            "outputs": [dict(t, name="y"), dict(t, name="h_out")],
            "state": [{"input": "h_in", "output": "h_out", "initial": 0.0}],
            "variants": [{"id": "fp32", "file": "a.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },  # fmt: skip
        {"a.onnx": onx.SerializeToString()},
    )
    with pytest.raises(errors.ResultCacheError, match=r"acc.*state pairs \[\('h_in', 'h_out'\)\]"):
        edge_sdk.load(tmp_path / "acc", PROFILE, result_cache=8)
    with edge_sdk.load(tmp_path / "acc", PROFILE) as m:  # without the cache it loads and streams
        assert m.stream().predict(np.ones((1, 4), np.float32)).outputs["y"][0, 0] == 1.0
    with edge_sdk.load(mlp_package, PROFILE, result_cache=8) as m:
        with pytest.raises(errors.ResultCacheError, match="stream"):
            m.stream()


def test_result_cache_option_is_validated(mlp_package: Path) -> None:
    for bad in (-1, True, "4", 2.0):
        with pytest.raises(ValueError, match="result_cache: expected an int >= 0"):
            edge_sdk.LoadOptions(result_cache=bad)
    with pytest.raises(ValueError, match="result_cache"):
        ResultCache(0, b"")
    with edge_sdk.load(mlp_package, PROFILE) as m:
        assert m.result_cache is None and m.describe()["result_cache"] is None
        assert not m.predict(_x(1)).cached and not m.predict(_x(1)).cached


def test_threads_share_one_cache_safely(mlp_package: Path) -> None:
    inputs = [_x(20 + i) for i in range(5)]
    with edge_sdk.load(mlp_package, PROFILE, variant="fp32") as plain:
        want = [plain.predict(x).outputs["y"].copy() for x in inputs]
    with edge_sdk.load(mlp_package, PROFILE, result_cache=3, telemetry=False) as m:
        bad: list[str] = []

        def work(t: int) -> None:
            for i in range(60):
                k = (i * (t + 1)) % len(inputs)
                r = m.predict(inputs[k])
                if not np.array_equal(r.outputs["y"], want[k]):
                    bad.append(f"thread {t} call {i}")

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=30)
        assert not any(th.is_alive() for th in threads)
        assert bad == []
        s = m.result_cache.stats()
        assert s.hits + s.misses == 240 and s.hits > 0 and s.size <= 3
        assert m.telemetry is None  # telemetry off: the cache's own counters still count


def test_counters_in_metrics_text(tmp_path: Path) -> None:
    from converters.packaging import write_package

    root = tmp_path / "m"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx(seed=9)})  # its own digest: its own series
    with edge_sdk.load(root, PROFILE, result_cache=4) as m, telemetry.MetricsServer() as srv:
        telemetry.forget_model(m)
        m.close()
        m = edge_sdk.load(root, PROFILE, result_cache=4)
        lab = dict(m.telemetry.labels)

        def scrape() -> dict[str, float]:
            with urllib.request.urlopen(srv.url, timeout=5) as resp:
                text = resp.read().decode()
            return {s.name: s.value for s in telemetry.parse(text) if "result_cache" in s.name and s.labels == lab}

        assert scrape() == {"edge_sdk_model_result_cache_hits_total": 0, "edge_sdk_model_result_cache_misses_total": 0}
        for _ in range(3):
            m.predict(_x(1))
        m.predict(_x(2))
        assert scrape() == {"edge_sdk_model_result_cache_hits_total": 2, "edge_sdk_model_result_cache_misses_total": 2}
        assert m.telemetry.snapshot()["result_cache"]["hit_rate"] == 0.5
        m.close()


def test_cli_result_cache(demo_package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    img = demo_package.parent / "samples" / "circle_1.png"
    rc = cli.main(["predict", str(demo_package), str(img), "--profile", PROFILE, "--repeat", "3", "--result-cache", "2", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cached"] is True and data["result_cache"]["hits"] == 2 and data["result_cache"]["misses"] == 1
