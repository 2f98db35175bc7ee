"""Silero VAD as an edge_sdk package, and the audio helpers around it.

Used by samples/vad_stream.py and the VAD tests (tests/test_vad_model.py,
tests/test_samples_signals.py, tests/test_streams.py):

* the package: :func:`vad_manifest`, :func:`build_vad_package` (from the ONNX file that
  ``tools.fetch_pretrained.fetch("silero-vad-16k")`` pins), :func:`load_vad`, and the stream
  settings Silero needs (:data:`VAD_OPTIONS`, :data:`VAD_CONSTANTS`);
* audio: :func:`read_wav` / :func:`write_wav` (16-bit PCM), :func:`resample` (numpy only);
* speech segments from per-window probabilities: :class:`HysteresisSegmenter`, :func:`segments`;
* test speech: :func:`espeak` (the espeak-ng program), :func:`utterances`, :func:`mix`.
"""

from __future__ import annotations

import functools
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile
import wave
from typing import Any, NamedTuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge_sdk.errors import InputError, MissingDependencyError  # noqa: E402
from edge_sdk.streams import SignalStreamOptions  # noqa: E402

__all__ = [
    "VAD", "SR", "HOP", "CONTEXT", "MAX_BATCH", "VAD_OPTIONS", "VAD_CONSTANTS", "TEXTS",
    "WavFormatError", "vad_manifest", "build_vad_package", "load_vad", "read_wav", "write_wav", "resample",
    "trim", "espeak", "utterances", "Mix", "mix", "standard_mix", "HysteresisSegmenter", "new_audio_span", "segments",
]  # fmt: skip

VAD = "silero-vad-16k"  # the name in tools/fetch_pretrained.py's table
SR = 16000
HOP = 512  # 32 ms of new audio per call
CONTEXT = 64  # Silero v5/v6 take the previous call's last 64 samples in front of the new 512
# window 576 = 64 context + 512 new, every 512; 64 zeros before the first window, as Silero's
# own OnnxWrapper does. (A plain 512-sample window without the context gives ~0 everywhere.)
VAD_OPTIONS = SignalStreamOptions(sample_rate_hz=SR, window=HOP + CONTEXT, hop=HOP, prefill=CONTEXT)
VAD_CONSTANTS = {"sr": np.array(SR, np.int64)}
TEXTS = ("The quick brown fox jumps over the lazy dog", "Edge devices listen for speech all day long")
MAX_BATCH = 64  # streams one call may take (the manifest's bound on the batch dim)


class WavFormatError(InputError):
    """A WAV file that is not 16-bit PCM mono (or not a WAV file at all)."""


# --- the package -------------------------------------------------------------------------


def vad_manifest(file: str = "silero_vad.onnx") -> dict[str, Any]:
    """A dynamic batch dim in [1, MAX_BATCH] (one row per stream): the state pair carries the
    LSTM state, one stream per row of axis 1 (``batch_axis``); ``sr`` is a constant, fed as is."""
    batch = {"batch": [1, MAX_BATCH]}
    return {
        "schema": 1,
        "name": "silero-vad",
        "version": "6.2.3",
        "task": "audio",
        "description": "Silero VAD v6, 16 kHz: speech probability per 32 ms (512 new samples + 64 of context)",
        "inputs": [
            {"name": "input", "dtype": "float32", "shape": ["batch", HOP + CONTEXT], "dims": batch},
            {"name": "state", "dtype": "float32", "shape": [2, "batch", 128], "dims": batch},
            {"name": "sr", "dtype": "int64", "shape": []},
        ],
        "outputs": [
            {"name": "output", "dtype": "float32", "shape": ["batch", 1]},
            {"name": "stateN", "dtype": "float32", "shape": [2, "batch", 128]},
        ],
        "state": [{"input": "state", "output": "stateN", "initial": 0.0, "batch_axis": 1}],
        "variants": [{"id": "fp32-onnx", "file": file, "backend": "onnxruntime", "precision": "fp32"}],
    }


def build_vad_package(folder: pathlib.Path, model_file: pathlib.Path) -> pathlib.Path:
    """Write the package (manifest + a copy of ``model_file``, digests filled in) to ``folder``."""
    from converters.packaging import write_package

    write_package(folder, vad_manifest(), {"silero_vad.onnx": model_file})
    return folder


def load_vad(folder: pathlib.Path, cache_dir: pathlib.Path, threads: int = 1):
    import edge_sdk

    return edge_sdk.load(folder, "generic-x86_64", threads=threads, cache_dir=cache_dir)


# --- audio ---------------------------------------------------------------------------------


def read_wav(path: pathlib.Path | str) -> tuple[np.ndarray, int]:
    """(samples as float64 in [-1, 1), sample rate) of a 16-bit PCM mono WAV file."""
    try:
        with wave.open(str(path)) as w:
            width, channels, sr = w.getsampwidth(), w.getnchannels(), w.getframerate()
            if width != 2 or channels != 1:
                raise WavFormatError(f"{path}: expected 16-bit PCM mono, got {8 * width}-bit, {channels} channel(s)")
            data = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise WavFormatError(f"{path}: expected a 16-bit PCM mono WAV file, cannot read it ({type(e).__name__}: {str(e) or 'file too short'})") from None
    return np.frombuffer(data, "<i2").astype(np.float64) / 32768.0, sr


def write_wav(path: pathlib.Path | str, x: np.ndarray, sr: int = SR) -> None:
    """Write samples in [-1, 1] as 16-bit PCM mono (clipped)."""
    pcm = np.clip(np.round(np.asarray(x, np.float64) * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def resample(x: np.ndarray, sr_in: int, sr_out: int, half: int = 24, beta: float = 8.0) -> np.ndarray:
    """Band-limited resampling with a Kaiser-windowed sinc (numpy only; no scipy needed).
    Each output sample is a 2*half-tap weighted sum around its position in the input,
    low-passed at 0.95 of the lower Nyquist. Output n sits at input position n*down/up
    (up/down = sr_out/sr_in in lowest terms), so there are only ``up`` distinct filters."""
    if sr_in == sr_out:
        return x.copy()
    g = math.gcd(sr_in, sr_out)
    up, down = sr_out // g, sr_in // g
    cutoff = 0.95 * min(1.0, sr_out / sr_in)
    taps = np.arange(-half + 1, half + 1)
    d = (np.arange(up) * down % up / up)[:, None] - taps[None, :]  # [phase, tap]: position - tap
    win = np.i0(beta * np.sqrt(np.clip(1.0 - (d / half) ** 2, 0.0, None))) / np.i0(beta)
    h = cutoff * np.sinc(cutoff * d) * win
    n = np.arange(len(x) * sr_out // sr_in)
    base, phase = n * down // up, n % up
    xp = np.concatenate([np.zeros(half), x, np.zeros(half + 1)])
    return np.einsum("nt,nt->n", xp[base[:, None] + taps[None, :] + half], h[phase])


def trim(x: np.ndarray, threshold: float = 0.01) -> np.ndarray:
    """Cut espeak's leading and trailing silence, so the speech boundaries are known."""
    idx = np.nonzero(np.abs(x) > threshold)[0]
    return x[idx[0] : idx[-1] + 1]


# --- speech for tests ------------------------------------------------------------------------


def espeak(text: str, out: pathlib.Path) -> None:
    """Speak ``text`` into the WAV file ``out`` with the espeak-ng program (22050 Hz mono)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingDependencyError(
            "espeak-ng is not installed: the VAD tests synthesize real speech with it. "
            "Install it (Debian/Ubuntu: `apt-get update && apt-get install -y espeak-ng`)"
        )
    subprocess.run([exe, "-v", "en", "-s", "150", "-w", str(out), text], check=True, capture_output=True, timeout=60)


@functools.lru_cache(maxsize=None)
def utterances() -> tuple[np.ndarray, ...]:
    """Each of TEXTS spoken by espeak-ng, resampled to 16 kHz, trimmed (float64, read-only)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(TEXTS):
            path = pathlib.Path(tmp) / f"u{i}.wav"
            espeak(text, path)
            x, sr = read_wav(path)
            y = trim(resample(x, sr, SR))
            y.setflags(write=False)
            out.append(y)
    return tuple(out)


class Mix(NamedTuple):
    audio: np.ndarray  # float32 [n] at 16 kHz
    speech_ms: tuple[tuple[float, float], ...]  # (start, end) of each utterance


def mix(parts: list[float | int], noise: float = 0.002, gain: float = 1.0, seed: int = 0) -> Mix:
    """Silence (a float: seconds) and utterances (an int: index into TEXTS), in order, plus
    Gaussian noise of standard deviation ``noise``."""
    speech = utterances()
    chunks, truth, t = [], [], 0
    for p in parts:
        if isinstance(p, float):
            chunks.append(np.zeros(int(round(p * SR))))
        else:
            chunks.append(speech[p] * gain)
            truth.append((t * 1000.0 / SR, (t + len(speech[p])) * 1000.0 / SR))
        t += len(chunks[-1])
    x = np.concatenate(chunks)
    x = x + np.random.default_rng(seed).normal(0.0, noise, len(x))
    return Mix(x.astype(np.float32), tuple(truth))


def standard_mix() -> Mix:
    """1.0 s silence, speech, 1.5 s silence, speech, 1.0 s silence, low noise."""
    return mix([1.0, 0, 1.5, 1, 1.0])


# --- speech segments ---------------------------------------------------------------------------


class HysteresisSegmenter:
    """Speech segments from per-window probabilities: speech starts at a window >= threshold,
    ends once probabilities stay < neg_threshold for min_silence_ms; segments shorter than
    min_speech_ms are dropped (Silero's get_speech_timestamps uses the same rules)."""

    def __init__(self, threshold: float = 0.5, neg_threshold: float = 0.35, min_speech_ms: float = 250.0, min_silence_ms: float = 300.0):
        self.threshold, self.neg_threshold = threshold, neg_threshold
        self.min_speech_ms, self.min_silence_ms = min_speech_ms, min_silence_ms
        self.reset()

    def reset(self) -> None:
        self._start: float | None = None
        self._silence: float | None = None
        self._last_end = 0.0

    @property
    def in_speech(self) -> bool:
        return self._start is not None

    def update(self, prob: float, start_ms: float, end_ms: float) -> list[tuple[float, float]]:
        """Feed one window's probability and the span of its new samples; returns closed segments."""
        self._last_end = end_ms
        if self._start is None:
            if prob >= self.threshold:
                self._start, self._silence = start_ms, None
            return []
        if prob >= self.neg_threshold:
            self._silence = None
            return []
        if self._silence is None:
            self._silence = start_ms
        if end_ms - self._silence >= self.min_silence_ms:
            return self._close(self._silence)
        return []

    def finish(self) -> list[tuple[float, float]]:
        return self._close(self._silence if self._silence is not None else self._last_end) if self._start is not None else []

    def _close(self, end: float) -> list[tuple[float, float]]:
        start, self._start, self._silence = self._start, None, None
        assert start is not None
        return [(start, end)] if end - start >= self.min_speech_ms else []


def new_audio_span(w) -> tuple[float, float]:
    """The span of a VAD window's 512 new samples (its first 64 are the previous call's)."""
    return w.timestamp_ms + CONTEXT * 1000.0 / SR, w.end_ms


def segments(results) -> list[tuple[float, float]]:
    seg = HysteresisSegmenter()
    out = []
    for w in results:
        out += seg.update(float(w.outputs["output"][0, 0]), *new_audio_span(w))
    return out + seg.finish()
