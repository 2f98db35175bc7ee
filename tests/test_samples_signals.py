"""The signal samples run as a user runs them (a subprocess, from another folder, PYTHONPATH = the
repo root): samples/imu_anomaly.py on the shipped demo CSV and its model, samples/vad_stream.py on
WAV files of real synthesized speech (espeak-ng) with Silero VAD; and tools/fixtures/train_imu.py
reproduces the shipped IMU model."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from tools.fixtures import fetch_pretrained as fp
from tools.fixtures import train_imu as ti
from tools.fixtures import vad_package as vp

IMU = ROOT / "samples" / "imu_anomaly.py"
VADS = ROOT / "samples" / "vad_stream.py"
DEMO = ROOT / "samples" / "data" / ti.DEMO_CSV
PKG = ROOT / "samples" / "data" / ti.PACKAGE_DIR
WINDOW_LINE = re.compile(r"^\s*([\d.]+)-\s*([\d.]+) s\s+(\w+)\s+([\d.]+)\s+anomaly\s+([\d.]+)(  << ANOMALY)?$", re.M)


def run(script: Path, *args: str, cwd: Path, env: dict | None = None, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    p = subprocess.run([sys.executable, str(script), *args], capture_output=True, cwd=cwd, env=env, input=stdin, timeout=timeout)
    p.stdout, p.stderr = p.stdout.decode(), p.stderr.decode()  # type: ignore[assignment]
    return p


def windows(out: str) -> list[tuple[float, float, str, float, float, bool]]:
    return [(float(a), float(b), lab, float(p), float(s), bool(f)) for a, b, lab, p, s, f in WINDOW_LINE.findall(out)]


def demo_rows() -> list[str]:
    return DEMO.read_text().splitlines(keepends=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """One cache for the module's runs (the sandbox check of a model runs once), holding the
    pinned VAD model, so the sample's fetch needs no network."""
    src = fp.fetch(vp.VAD)  # the normal cache (module fixtures run before the per-test cache)
    cache = tmp_path_factory.mktemp("vad-sample-cache")
    (cache / "pretrained").mkdir()
    shutil.copyfile(src, cache / "pretrained" / src.name)
    return {"EDGE_SDK_CACHE": str(cache), "EDGE_SDK_PROFILE": "generic-x86_64"}


# --- IMU -----------------------------------------------------------------------------------------


def test_imu_demo_windows_match_the_recordings_activities_and_the_drop_is_flagged(tmp_path, env):
    p = run(IMU, cwd=tmp_path, env=env)  # no arguments: the shipped demo CSV and package
    assert p.returncode == 0, p.stderr
    got = windows(p.stdout)
    n_rows = len(demo_rows()) - 1
    assert len(got) == (n_rows - ti.WINDOW) // ti.HOP + 1 == 84
    assert [w[0] for w in got] == [float(i) for i in range(84)]  # 2 s windows every 1 s
    # Ground truth: the schedule the script generated the recording from.
    spans, t = [], 0.0
    for kind, d in ti.DEMO_SCHEDULE:
        spans.append((kind, t, t + d))
        t += d
    inside = [(w, k) for w in got for k, a, b in spans if k in ti.LABELS and a <= w[0] and w[1] <= b]
    assert len(inside) >= 60 and {k for _, k in inside} == set(ti.LABELS)
    right = sum(w[2] == k for w, k in inside)
    assert right >= 0.95 * len(inside), [(w[:3], k) for w, k in inside if w[2] != k]
    # The drop (free fall at DEMO_DROP_S, then an impact) and nothing else is flagged.
    flagged = [w for w in got if w[5]]
    assert flagged and all(w[0] <= ti.DEMO_DROP_S <= w[1] for w in flagged), flagged
    assert all(w[4] > 1.0 for w in flagged) and all(w[4] <= 1.0 for w in got if not w[5])
    assert "anomalies: 1\n  73.00-76.00 s (peak score" in p.stdout
    assert f"summary: {n_rows} rows, 84 windows" in p.stdout and "gaps: 0, malformed rows: 0" in p.stdout


def test_imu_gap_and_malformed_rows_are_reported_where_they_are(tmp_path, env):
    rows = demo_rows()  # rows[k] (k >= 1) is the sample at (k - 1) * 20 ms
    bad = rows[:1001] + rows[1051:]  # 1 s missing: 20.00 .. 20.98 s
    bad.insert(1501, "30.00,0.1,abc,0.2,0,0,0\n")  # a number that is not one
    bad.insert(2001, "40.00,0.1,0.2\n")  # a truncated row
    (tmp_path / "bad.csv").write_text("".join(bad))
    p = run(IMU, "bad.csv", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert "GAP at 21.00 s: stream 'bad.csv': gap of 1000.000 ms (50 samples at 50 Hz)" in p.stdout
    assert "MALFORMED line 1502: expected 7 numbers (t,ax,ay,az,gx,gy,gz), got '30.00,0.1,abc,0.2,0,0,0' (row skipped)" in p.stdout
    assert "MALFORMED line 2002: expected 7 comma-separated numbers (t,ax,ay,az,gx,gy,gz), got 3 field(s)" in p.stdout
    assert "gaps: 1, malformed rows: 2" in p.stdout
    # After the gap the windows restart at the first sample after it (nothing straddles the gap).
    starts = [w[0] for w in windows(p.stdout)]
    assert 18.0 in starts and 21.0 in starts and not any(18.0 < s < 21.0 for s in starts), starts
    # --strict: the first problem stops the run with its typed error.
    p = run(IMU, "bad.csv", "--strict", cwd=tmp_path, env=env)
    assert p.returncode == 1 and "error: GapError: stream 'bad.csv': gap of 1000.000 ms" in p.stderr, p.stderr
    (tmp_path / "bad2.csv").write_text("".join(rows[:300] + ["5.98,1,2,3\n"] + rows[300:]))
    p = run(IMU, "bad2.csv", "--strict", cwd=tmp_path, env=env)
    assert p.returncode == 1 and "error: CsvRowError: line 301: expected 7 comma-separated numbers" in p.stderr, p.stderr


def test_imu_wrong_rate_and_bad_input_are_clear_errors(tmp_path, env):
    rows = demo_rows()
    fast = [rows[0]] + [f"{(k - 1) * 0.01:.2f}" + r[r.index(",") :] for k, r in enumerate(rows[1:], 1)]
    (tmp_path / "fast.csv").write_text("".join(fast))
    p = run(IMU, "fast.csv", cwd=tmp_path, env=env)
    assert p.returncode == 1 and "SampleRateError: expected 50 Hz samples (20 ms apart), the first rows are 10.00 ms apart (100.0 Hz)" in p.stderr
    assert "OVERLAP" not in p.stdout  # refused before any row reached the stream
    # The same file in milliseconds is fine once the unit is said.
    ms = [rows[0]] + [f"{(k - 1) * 20}" + r[r.index(",") :] for k, r in enumerate(rows[1:400], 1)]
    (tmp_path / "ms.csv").write_text("".join(ms))
    p = run(IMU, "ms.csv", "--time-unit", "ms", cwd=tmp_path, env=env)
    assert p.returncode == 0 and len(windows(p.stdout)) == 6, p.stdout + p.stderr
    p = run(IMU, "missing.csv", cwd=tmp_path, env=env)
    assert p.returncode == 1 and "cannot read missing.csv" in p.stderr
    p = run(IMU, "--package", str(tmp_path), cwd=tmp_path, env=env)
    assert p.returncode == 1 and "no edge-model.toml" in p.stderr
    p = run(IMU, "--help", cwd=tmp_path, env=env)
    assert p.returncode == 0 and "--follow" in p.stdout and "--strict" in p.stdout


def test_imu_stdin_and_follow_give_the_file_results(tmp_path, env):
    whole = windows(run(IMU, str(DEMO), cwd=tmp_path, env=env).stdout)
    p = run(IMU, "-", cwd=tmp_path, env=env, stdin=DEMO.read_bytes())
    assert p.returncode == 0 and windows(p.stdout) == whole
    # --follow: a logger writes the file while the sample reads it; the last line is half-written for a while.
    text = DEMO.read_text()
    cut = text.index("\n", len(text) // 2) + 20  # mid-row
    live = tmp_path / "live.csv"
    live.write_text(text[:cut])
    penv = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    cmd = [sys.executable, str(IMU), str(live), "--follow", "--idle-exit", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=penv, cwd=tmp_path)
    try:
        # Wait for the last window the first part holds: it has read up to the half-written row ...
        last = float((text[:cut].count("\n") - 1 - ti.WINDOW) // ti.HOP)
        first: list[str] = []
        while not first or not windows(first[-1]) or windows(first[-1])[0][0] < last:
            first.append(proc.stdout.readline())
            assert first[-1] and len(first) < 200, first[-5:]
        assert windows("".join(first)) == whole[: len(first)] and proc.poll() is None
        time.sleep(0.5)  # (it reads the rest of the first part and the half row meanwhile, then polls)
        with live.open("a") as f:  # ... for the rest, and the rest of the half-written row
            f.write(text[cut:])
        out, _ = proc.communicate(timeout=60)
        out = "".join(first) + out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and windows(out) == whole
    assert "MALFORMED" not in out


def test_shipped_model_graph_computes_the_scripts_features_and_scores():
    """The ONNX in the package is the script's model: its outputs equal the numpy reference."""
    import onnx

    from edge_sdk.package import ModelPackage

    pkg = ModelPackage.open(PKG)  # digests verified
    data = (PKG / ti.ONNX_NAME).read_bytes()
    assert hashlib.sha256(data).hexdigest() == pkg.manifest.variants[0].sha256
    m = onnx.load_from_string(data)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    p = {"mu": inits["mu"], "sd": inits["sd"], "class_mean": inits["cmean"], "class_whiten": inits["cwhiten"]}
    y, x = ti.simulate(ti.DEMO_SCHEDULE, ti.DEMO_SEED)
    X, _ = ti.windows(y, x, hop=ti.HOP, purity=1.0)
    logits, score = ti.run_onnx(data, X)
    want = ti.anomaly_distance(ti.features(X), p) / float(inits["threshold"])
    np.testing.assert_allclose(score, want, rtol=1e-4, atol=1e-5)
    z = (ti.features(X) - p["mu"]) / p["sd"]
    h = np.maximum(z @ inits["w1"] + inits["b1"], 0)
    np.testing.assert_allclose(logits, h @ inits["w2"] + inits["b2"], rtol=1e-4, atol=1e-4)


def test_train_imu_reproduces_the_shipped_model_and_demo(tmp_path):
    figures = ti.build(tmp_path, log=False)  # a few seconds
    from edge_sdk.package import ModelPackage

    shipped = ModelPackage.open(PKG).manifest.variants[0].quality
    fresh = ModelPackage.open(tmp_path / ti.PACKAGE_DIR).manifest.variants[0].quality
    assert fresh.samples == shipped.samples and abs(fresh.value - shipped.value) <= 0.005
    assert figures["accuracy"] >= 0.95 and figures["false_alarm_rate"] <= 0.01 and figures["drops_detected"] == "8/8", figures
    # The demo recording is regenerated (to the CSV's 4 decimals)...
    def load(path: Path) -> np.ndarray:
        return np.loadtxt(path, delimiter=",", skiprows=1)

    np.testing.assert_allclose(load(tmp_path / ti.DEMO_CSV), load(DEMO), rtol=0, atol=2e-4)
    # ... and the retrained model classifies and scores it as the shipped one does.
    y, x = ti.simulate(ti.DEMO_SCHEDULE, ti.DEMO_SEED)
    X, _ = ti.windows(y, x, hop=ti.HOP, purity=1.0)
    l0, s0 = ti.run_onnx((PKG / ti.ONNX_NAME).read_bytes(), X)
    l1, s1 = ti.run_onnx((tmp_path / ti.PACKAGE_DIR / ti.ONNX_NAME).read_bytes(), X)
    assert (l0.argmax(1) == l1.argmax(1)).mean() >= 0.98
    assert ((s0 > 1) == (s1 > 1)).all()


# --- VAD ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wavs(tmp_path_factory) -> dict:
    """a.wav: 16 kHz, two sentences; b.wav: 22.05 kHz (the sample resamples), the other sentence
    first, shorter pauses; c.wav: noise only. With the speech spans each really has."""
    d = tmp_path_factory.mktemp("wavs")
    a = vp.mix([1.0, 0, 1.5, 1, 1.0])
    b = vp.mix([2.0, 1, 0.8, 0, 0.7], seed=1)
    vp.write_wav(d / "a.wav", a.audio)
    vp.write_wav(d / "b.wav", vp.resample(b.audio.astype(np.float64), vp.SR, 22050), 22050)
    vp.write_wav(d / "c.wav", np.random.default_rng(3).normal(0, 0.01, 4 * vp.SR))
    return {"dir": d, "a": a.speech_ms, "b": b.speech_ms}


def segments_of(out: str, name: str) -> list[tuple[float, float]]:
    return [(float(s), float(e)) for s, e in re.findall(rf"^{re.escape(name)}: speech (\d+)-(\d+) ms$", out, re.M)]


def probs_of(out: str, name: str) -> list[str]:
    return re.findall(rf"^{re.escape(name)}: +(\d+ ms  p=[\d.]+)$", out, re.M)


def test_vad_finds_each_streams_speech_where_it_is(wavs, env):
    p = run(VADS, "a.wav", "b.wav", "c.wav", cwd=wavs["dir"], env=env)
    assert p.returncode == 0, p.stderr
    for name in ("a", "b"):
        found, truth = segments_of(p.stdout, f"{name}.wav"), wavs[name]
        assert len(found) == len(truth) == 2, (name, found, truth)
        for (s0, e0), (s1, e1) in zip(found, truth):
            assert abs(s0 - s1) <= 150 and abs(e0 - e1) <= 150, (name, found, truth)
    assert segments_of(p.stdout, "c.wav") == []  # noise only, next to two speaking streams
    assert "summary c.wav: 0 segment(s), 0.00 s of speech in 4.00 s" in p.stdout
    assert re.search(r"^summary a\.wav: 2 segment\(s\), 5\.\d\d s of speech in 9\.\d\d s$", p.stdout, re.M), p.stdout


def test_vad_streams_keep_their_own_state(wavs, env):
    """Each file's per-window probabilities are the same alone, interleaved with others in one
    batched router, and unbatched: no state is shared between streams."""
    d = wavs["dir"]
    alone = {n: run(VADS, f"{n}.wav", "--verbose", cwd=d, env=env).stdout for n in ("a", "b")}
    together = run(VADS, "b.wav", "c.wav", "a.wav", "--verbose", cwd=d, env=env).stdout
    unbatched = run(VADS, "a.wav", "b.wav", "--verbose", "--batch", "1", "--chunk-ms", "7", cwd=d, env=env).stdout
    blocks = run(VADS, "--block", "c.wav", "a.wav", "b.wav", "--verbose", cwd=d, env=env).stdout  # push_block per round
    for n in ("a", "b"):
        ref = probs_of(alone[n], f"{n}.wav")
        assert len(ref) > 200
        assert probs_of(together, f"{n}.wav") == ref
        assert probs_of(unbatched, f"{n}.wav") == ref
        assert probs_of(blocks, f"{n}.wav") == ref
        assert segments_of(together, f"{n}.wav") == segments_of(alone[n], f"{n}.wav") == segments_of(unbatched, f"{n}.wav") == segments_of(blocks, f"{n}.wav")
    probs_a = np.array([float(s.split("p=")[1]) for s in probs_of(alone["a"], "a.wav")])
    assert probs_a.max() > 0.9 and probs_a.min() < 0.05  # (the comparison is between informative numbers)


def test_vad_raw_pcm_on_stdin_and_package_option(wavs, env, tmp_path):
    x, sr = vp.read_wav(wavs["dir"] / "a.wav")
    pcm = np.round(x * 32768).astype("<i2").tobytes()
    p = run(VADS, "--raw", "-", cwd=tmp_path, env=env, stdin=pcm)
    assert p.returncode == 0, p.stderr
    assert segments_of(p.stdout, "-") == segments_of(run(VADS, str(wavs["dir"] / "a.wav"), cwd=tmp_path, env=env).stdout, str(wavs["dir"] / "a.wav"))
    assert len(segments_of(p.stdout, "-")) == 2
    pkg = vp.build_vad_package(tmp_path / "pkg", Path(env["EDGE_SDK_CACHE"]) / "pretrained" / f"{fp.MODELS[vp.VAD].sha256}.onnx")
    p = run(VADS, "--raw", "-", "--seconds", "3", "--package", str(pkg), cwd=tmp_path, env=env, stdin=pcm)
    assert p.returncode == 0, p.stderr
    (seg,) = segments_of(p.stdout, "-")  # the first sentence only: it stopped at 3 s
    assert abs(seg[0] - wavs["a"][0][0]) <= 150 and "in 3.00 s" in p.stdout


def test_vad_bad_inputs_are_clear_errors(wavs, env, tmp_path):
    import wave

    with wave.open(str(tmp_path / "stereo.wav"), "wb") as w:
        w.setnchannels(2), w.setsampwidth(2), w.setframerate(16000), w.writeframes(b"\0" * 6400)
    (tmp_path / "junk.wav").write_bytes(b"RIFF not really")
    for f, msg in (("stereo.wav", "expected 16-bit PCM mono, got 16-bit, 2 channel(s)"), ("junk.wav", "expected a 16-bit PCM mono WAV file"), ("nope.wav", "No such file")):
        p = run(VADS, str(wavs["dir"] / "a.wav"), f, cwd=tmp_path, env=env)
        assert p.returncode == 1 and msg in p.stderr and "speech" not in p.stdout, (f, p.stderr)
    assert "WavFormatError" in run(VADS, "stereo.wav", cwd=tmp_path, env=env).stderr
    p = run(VADS, cwd=tmp_path, env=env)
    assert p.returncode == 2 and "give WAV files, or --mic, or --raw FILE" in p.stderr
    p = run(VADS, "--block", "--raw", "-", cwd=tmp_path, env=env, stdin=b"")
    assert p.returncode == 2 and "--block takes WAV files" in p.stderr
    p = run(VADS, "--package", str(tmp_path), "--raw", "-", cwd=tmp_path, env=env, stdin=b"")
    assert p.returncode == 1 and "cannot load the VAD model" in p.stderr
    p = run(VADS, "--help", cwd=tmp_path, env=env)
    assert p.returncode == 0 and "--mic" in p.stdout and "arecord" in p.stdout
