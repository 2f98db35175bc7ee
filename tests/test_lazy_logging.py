"""The SDK's loggers are made on first use: loading a model and predicting imports no ``logging``,
and the first message (a listener that raised) goes to the real ``logging.getLogger(name)``."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk._listeners import Listeners
from edge_sdk._log import get_logger

ROOT = Path(__file__).resolve().parents[1]


def test_a_warm_load_and_predict_import_no_logging_queue_or_subprocess(tmp_path: Path) -> None:
    code = (
        "import json, sys, numpy as np, edge_sdk\n"
        f"m = edge_sdk.load(edge_sdk.demo_package_path(), 'generic-x86_64', cache_dir={str(tmp_path)!r})\n"
        "m.predict_image(np.zeros((32, 32, 3), np.uint8))\n"
        "print(json.dumps(sorted(k for k in ('logging', 'queue', 'subprocess') if k in sys.modules)))\n"
    )
    first, warm = (subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True) for _ in range(2))
    assert "subprocess" in json.loads(first.stdout.strip().splitlines()[-1])  # the first load checks the model in a sandbox child
    assert json.loads(warm.stdout.strip().splitlines()[-1]) == []  # a warm one starts none, and nothing logged


def test_the_first_message_goes_to_the_named_logger(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("edge_sdk.test-lazy")
    with caplog.at_level(logging.INFO, logger="edge_sdk.test-lazy"):
        log.info("hello %s", "there")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("edge_sdk.test-lazy", logging.INFO, "hello there")]
    assert log.isEnabledFor(logging.CRITICAL) is logging.getLogger("edge_sdk.test-lazy").isEnabledFor(logging.CRITICAL)

    def bad(_: object) -> None:
        raise RuntimeError("boom")

    seen: list[object] = []
    ls: Listeners[object] = Listeners("the test owner")
    ls.add(bad)
    ls.add(seen.append)
    with caplog.at_level(logging.ERROR, logger="edge_sdk"):
        ls.emit("event")
    assert seen == ["event"]  # the raising listener did not stop the next one
    rec = [r for r in caplog.records if r.name == "edge_sdk"]
    assert len(rec) == 1 and "the test owner: an event listener raised" in rec[0].getMessage() and rec[0].exc_info is not None
