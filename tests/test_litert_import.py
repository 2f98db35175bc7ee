"""LiteRT runtime discovery: ai_edge_litert first, tflite_runtime accepted, and a
clear error naming the extra when neither exists. Run in subprocesses so the
import machinery is fresh; `tflite_runtime` is provided by a shim package that
re-exports the real ai_edge_litert interpreter (tflite-runtime 2.14, its last
release, cannot create an interpreter under numpy 2, so it cannot be installed
for real here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

BLOCK = textwrap.dedent(
    """
    import sys, importlib.abc
    class Block(importlib.abc.MetaPathFinder):
        def __init__(self, names): self.names = names
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in self.names:
                raise ImportError(f'{name} blocked for this test')
            return None
    """
)


def _run(code: str, tmp_path: Path, shim: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths = [str(ROOT)]
    if shim:
        pkg = tmp_path / "shim" / "tflite_runtime"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        # the real interpreter, loaded under tflite_runtime's module name
        real = Path(__import__("ai_edge_litert").__file__).parent / "interpreter.py"
        (pkg / "interpreter.py").write_text(
            "from ai_edge_litert_real.interpreter import *  # noqa: F401,F403\n"
            "from ai_edge_litert_real.interpreter import Interpreter, load_delegate\n"
        )
        paths.insert(0, str(tmp_path / "shim"))
        assert real.exists()
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_missing_litert_names_the_extra(tmp_path: Path) -> None:
    code = BLOCK + textwrap.dedent(
        """
        sys.meta_path.insert(0, Block({'ai_edge_litert', 'tflite_runtime'}))
        from edge_sdk.backends import base
        st = base.backend_status('litert')
        assert not st.available, st
        print(st.detail)
        """
    )
    p = _run(code, tmp_path, shim=False)
    assert p.returncode == 0, p.stderr
    assert "edge-sdk[litert]" in p.stdout and "tflite-runtime" in p.stdout


def test_tflite_runtime_is_accepted(tmp_path: Path) -> None:
    # Block ai_edge_litert under its own name, expose its interpreter as tflite_runtime.
    code = textwrap.dedent(
        """
        import importlib, sys, importlib.util as u
        import numpy as np
        from converters.tflite_writer import TFLiteBuilder
        b = TFLiteBuilder(); x = b.input('x', shape=(1, 4), dtype='float32')
        b.output(b.fully_connected(x, np.eye(4, dtype=np.float32) * 2, np.zeros(4, np.float32)), 'y')
        data = b.build()
        import ai_edge_litert as real_pkg
        sys.modules['ai_edge_litert_real'] = real_pkg
        sys.modules['ai_edge_litert_real.interpreter'] = importlib.import_module('ai_edge_litert.interpreter')
        for k in [k for k in sys.modules if k == 'ai_edge_litert' or k.startswith('ai_edge_litert.')]:
            del sys.modules[k]
        """
    ) + BLOCK + textwrap.dedent(
        """
        sys.meta_path.insert(0, Block({'ai_edge_litert'}))
        from edge_sdk.backends import base
        st = base.backend_status('litert')
        assert st.available and st.runtime == 'tflite-runtime', st
        from edge_sdk.backends.base import ModelSource, SessionOptions, open_session
        from pathlib import Path
        s = open_session('litert', ModelSource(data, Path('m.tflite'), 'x'), SessionOptions())
        print(s.info.runtime, s.run({'x': np.ones((1, 4), np.float32)})['y'].tolist())
        """
    )
    p = _run(code, tmp_path, shim=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "tflite-runtime [[2.0, 2.0, 2.0, 2.0]]"
