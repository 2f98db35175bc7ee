"""The NaN/Inf check on every float input: exact at every size and dtype, whichever pass it takes
(a Python sum for small inputs, one BLAS pass np.vdot for larger float32/float64 ones, np.isfinite for
float16), with no floating-point warning or error from an overflowing sum, inline or beside the run."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.errors import NonFiniteInputError
from edge_sdk.package import TensorSpec
from edge_sdk.validation import _SMALL, OVERLAP_MIN, SCANNER, FiniteScanner, InputValidator, first_nonfinite

SIZES = (1, _SMALL, _SMALL + 1, 1000, OVERLAP_MIN - 1, OVERLAP_MIN, 3 * 224 * 224)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", SIZES)
def test_every_non_finite_value_is_refused_and_finite_extremes_pass(dtype: str, n: int) -> None:
    v = InputValidator([TensorSpec("x", dtype, (1, n))])
    rng = np.random.default_rng(n)
    x = rng.standard_normal((1, n)).astype(dtype)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")  # no RuntimeWarning (nor FloatingPointError) from an overflowing sum or dot product
        assert v(x)["x"] is x
        big = x.copy()
        big[0, :] = np.finfo(dtype).max  # finite, but every sum and square overflows
        big[0, 0] = np.finfo(dtype).min
        assert v(big)["x"] is big
        for bad in (np.nan, np.inf, -np.inf):
            for at in {0, n // 2, n - 1}:
                y = x.copy()
                y[0, at] = bad
                with pytest.raises(NonFiniteInputError, match=r"got 1 NaN/Inf of"):
                    v(y)
        y = x.copy()
        y[0, 0], y[0, -1] = np.inf, -np.inf  # inf - inf: NaN in a sum, refused all the same
        if n > 1:
            with pytest.raises(NonFiniteInputError, match=r"got 2 NaN/Inf"):
                v(y)


# --- the scan overlapped with inference (FiniteScanner) ---------------------------------------


def _big_input_package(tmp_path: Path, n: int) -> Path:
    """A real ONNX model y = x + 1 over a float32 [1, n] input (n >= OVERLAP_MIN: its scan can be overlapped)."""
    from onnx import TensorProto, helper, numpy_helper

    from converters.packaging import write_package

    one = numpy_helper.from_array(np.ones((1, n), np.float32), "one")
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])], "add1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=[one],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return write_package(
        tmp_path / "pkg",
        {
            "name": "add1", "version": "1", "task": "raw",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, n]}], "outputs": [{"name": "y", "dtype": "float32", "shape": [1, n]}],
            "variants": [{"id": "fp32-onnx", "file": "model.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },
        files={"model.onnx": m.SerializeToString()},
    )  # fmt: skip


def test_a_large_input_is_scanned_beside_the_run_with_the_same_verdict_error_and_accounting(tmp_path: Path) -> None:
    import edge_sdk
    from edge_sdk.profiles import usable_cpus

    n = OVERLAP_MIN + 5
    pkg = _big_input_package(tmp_path, n)
    with edge_sdk.load(pkg, "generic-x86_64", threads=1, cache_dir=tmp_path / "c") as m, edge_sdk.load(
        pkg, "generic-x86_64", threads=1, cache_dir=tmp_path / "c", result_cache=4
    ) as cached:
        # overlapped exactly where a CPU is left free by the session's one thread; never with a result cache
        assert m._overlap is (usable_cpus() > 1)
        assert cached._overlap is False
        x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
        assert np.array_equal(m.predict(x).outputs["y"], x + 1)
        for bad in (np.nan, np.inf, -np.inf):
            for at in (0, n // 2, n - 1):
                y = x.copy()
                y[0, at] = bad
                with pytest.raises(NonFiniteInputError, match=rf"^input 'x': expected finite values, got 1 NaN/Inf of {n}$"):
                    m.predict(y)
                with pytest.raises(NonFiniteInputError, match=rf"^input 'x': expected finite values, got 1 NaN/Inf of {n}$"):
                    cached.predict(y)
        y = x.copy()
        y[0, :7] = np.nan
        with pytest.raises(NonFiniteInputError, match="got 7 NaN/Inf"):
            m.predict({"x": y})  # the dict form defers too
        snap = m.telemetry.snapshot()  # shared by both models (one provenance): 11 calls of m, 9 of cached
        assert snap["requests"] == 11 + 9 and snap["errors"] == {"NonFiniteInputError": 10 + 9}
        assert snap["stages"]["inference"]["count"] == 1  # a refused input's run is never recorded
        assert np.array_equal(m.predict(x).outputs["y"], x + 1)  # and the model goes on
    # the verdict decides over the run's own error, as when the scan ran first: a closed model
    # refuses a NaN input as non-finite, a finite one as closed
    with pytest.raises(NonFiniteInputError):
        m.predict(y)
    with pytest.raises(edge_sdk.errors.SessionClosedError):
        m.predict(x)


def test_the_scanner_is_never_queued_behind_itself_and_reports_each_verdict() -> None:
    s = FiniteScanner()
    big = np.ones(4_000_000, np.float32)  # tens of milliseconds of scanning: the second submit comes while it runs
    bad = big.copy()
    bad[-1] = np.nan
    first = s.submit([("a", bad)])
    assert first is not None
    assert s.submit([("b", big)]) is None  # busy: that caller scans inline
    err = first.wait()
    assert isinstance(err, NonFiniteInputError) and "input 'a'" in str(err)
    assert first.wait() is err  # waiting again returns the same verdict
    again = s.submit([("b", big), ("c", bad)])  # free again once the verdict is out
    assert again is not None
    err = again.wait()
    assert isinstance(err, NonFiniteInputError) and "input 'c'" in str(err)
    assert s.submit([("d", big)]).wait() is None  # type: ignore[union-attr]
    assert first_nonfinite([("e", big)]) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
def test_a_forked_child_gets_its_own_scanning_thread() -> None:
    bad = np.ones(OVERLAP_MIN, np.float32)
    bad[3] = np.inf
    assert isinstance(SCANNER.submit([("x", bad)]).wait(), NonFiniteInputError)  # type: ignore[union-attr]  # the parent's thread exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here; a scan must still finish
        code = 1
        try:
            job = SCANNER.submit([("x", bad)])
            code = 0 if job is not None and isinstance(job.wait(), NonFiniteInputError) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
