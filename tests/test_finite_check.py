"""The NaN/Inf check on every float input: exact at every size and dtype, whichever pass it takes
(a Python sum for small inputs, np.isfinite for medium ones, a BLAS dot product for large ones)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from edge_sdk.errors import NonFiniteInputError
from edge_sdk.package import TensorSpec
from edge_sdk.validation import _LARGE, _SMALL, InputValidator

SIZES = (1, _SMALL, _SMALL + 1, 1000, _LARGE - 1, _LARGE, 3 * 224 * 224)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", SIZES)
def test_every_non_finite_value_is_refused_and_finite_extremes_pass(dtype: str, n: int) -> None:
    v = InputValidator([TensorSpec("x", dtype, (1, n))])
    rng = np.random.default_rng(n)
    x = rng.standard_normal((1, n)).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning leaks from an overflowing sum or dot product
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
