"""Streaming voice-activity detection (Silero VAD) over several audio streams, with edge_sdk.

    python samples/vad_stream.py A.wav [B.wav ...]      # each file is one stream
    python samples/vad_stream.py --block A.wav [B.wav ...]  # every stream's next 32 ms in one call
    python samples/vad_stream.py --mic [--device hw:1,0] [--seconds S]
    arecord -q -f S16_LE -r 16000 -c 1 -t raw | python samples/vad_stream.py --raw -

Every input is a stream of one StreamRouter: audio arrives in small chunks, interleaved across
streams as it would from several microphones, and each stream keeps its own VAD state (an
LSTM state carried from one 32 ms window to the next), so one stream's speech never leaks into
another's. Windows of several streams run as one batched model call. Speech segments are
printed per stream as they end (``NAME: speech START-END ms``), then a summary.

``--block`` is what a server holding every stream's audio does: each round, the next 32 ms (one
Silero hop, 512 samples) of every stream go to ``StreamRouter.push_block`` as one [streams, 512]
array, which checks, cuts and runs them together and returns the windows as columns (a file's
last, shorter chunk is pushed alone). The probabilities are the same as with ``push``.

WAV files must be 16-bit PCM mono; other sample rates are resampled to 16 kHz. ``--mic`` reads
16 kHz mono S16_LE PCM from ALSA's ``arecord`` (package alsa-utils); ``--raw FILE|-`` reads the
same from a file or stdin. The model is Silero VAD 6.2.3, fetched and pinned by
tools/fixtures/fetch_pretrained.py (the network is needed once; then it is cached), or --package DIR.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

import edge_sdk
from edge_sdk.streams import StreamRouter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tools/ fetches and packages the model
from tools.fixtures import fetch_pretrained  # noqa: E402
from tools.fixtures.vad_package import (  # noqa: E402
    HOP,
    MAX_BATCH,
    SR,
    VAD,
    VAD_CONSTANTS,
    VAD_OPTIONS,
    HysteresisSegmenter,
    build_vad_package,
    new_audio_span,
    read_wav,
    resample,
)


def load_model(package: str | None) -> edge_sdk.Model:
    if package:
        return edge_sdk.load(package, threads=1)  # a 1.3 MB model: one thread per call is fastest
    # Build the package around the pinned ONNX file (digests, state pair, batch bounds).
    with tempfile.TemporaryDirectory() as tmp:
        pkg = build_vad_package(Path(tmp) / "silero-vad", fetch_pretrained.fetch(VAD))
        return edge_sdk.load(pkg, threads=1)  # the session holds what it needs; tmp can go


def wav_chunks(path: str, chunk: int) -> Iterator[np.ndarray]:
    """The file's audio at 16 kHz in chunks. Read now, so a bad file fails before any stream starts."""
    x, sr = read_wav(path)  # WavFormatError unless 16-bit PCM mono
    if sr != SR:
        x = resample(x, sr, SR)  # Silero takes 16 kHz; a windowed-sinc resampler keeps the speech band
    x = x.astype(np.float32)
    return (x[i : i + chunk] for i in range(0, len(x), chunk))


def pcm_chunks(f: BinaryIO, chunk: int) -> Iterator[np.ndarray]:
    """Raw S16_LE mono PCM, ``chunk`` samples at a time, as the bytes arrive."""
    rest = b""
    while True:
        data = f.read(2 * chunk - len(rest))
        if not data:
            return
        rest += data
        if len(rest) >= 2 * chunk:
            yield np.frombuffer(rest[: 2 * chunk], "<i2").astype(np.float32) / 32768.0
            rest = rest[2 * chunk :]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wav", nargs="*", help="WAV files, one stream each")
    ap.add_argument("--mic", action="store_true", help="listen to the microphone through arecord (ALSA)")
    ap.add_argument("--device", help="ALSA capture device for --mic, e.g. hw:1,0 (default: arecord's)")
    ap.add_argument("--seconds", type=float, default=0.0, help="--mic/--raw: stop after S seconds of audio (0: at the end / Ctrl-C)")
    ap.add_argument("--raw", metavar="FILE", help="16 kHz mono S16_LE PCM from FILE, or - for stdin")
    ap.add_argument("--package", help="the Silero VAD package (default: built from the pinned, fetched model)")
    ap.add_argument("--batch", type=int, default=0, help="streams per model call (default: all of them, at most 64; 1: unbatched)")
    ap.add_argument("--chunk-ms", type=int, default=20, help="audio per push, as a capture driver would deliver it (default 20)")
    ap.add_argument("--block", action="store_true", help="WAV files: push every stream's next 32 ms in one push_block call per round")
    ap.add_argument("--threshold", type=float, default=0.5, help="speech starts at this probability (ends below threshold - 0.15)")
    ap.add_argument("--verbose", action="store_true", help="print every window's speech probability")
    args = ap.parse_args(argv)
    if bool(args.wav) + args.mic + (args.raw is not None) != 1:
        ap.error("give WAV files, or --mic, or --raw FILE (one of them)")
    if args.block and not args.wav:
        ap.error("--block takes WAV files (every stream's audio at hand)")
    sys.stdout.reconfigure(line_buffering=True)
    chunk = HOP if args.block else SR * args.chunk_ms // 1000

    # The sources: name -> iterator of float32 chunks at 16 kHz.
    proc = None
    if args.mic:
        exe = shutil.which("arecord")
        if exe is None:
            print("error: --mic needs arecord (Debian/Raspberry Pi OS: apt-get install alsa-utils)", file=sys.stderr)
            return 1
        cmd = [exe, "-q", "-f", "S16_LE", "-r", str(SR), "-c", "1", "-t", "raw"] + (["-D", args.device] if args.device else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        sources = {"mic": pcm_chunks(proc.stdout, chunk)}
    elif args.raw is not None:
        sources = {args.raw: pcm_chunks(sys.stdin.buffer if args.raw == "-" else open(args.raw, "rb"), chunk)}
    else:
        names = [w if args.wav.count(w) == 1 else f"{w}#{i}" for i, w in enumerate(args.wav)]  # ids must be unique
        try:
            sources = {n: wav_chunks(w, chunk) for n, w in zip(names, args.wav)}
        except (edge_sdk.EdgeSDKError, OSError) as e:  # WavFormatError (an InputError), missing file
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    limit = int(args.seconds * SR) if args.seconds > 0 else None

    try:
        model = load_model(args.package)
    except (edge_sdk.EdgeSDKError, fetch_pretrained.FetchError) as e:  # a bad package, no network for the first fetch ...
        print(f"error: cannot load the VAD model: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    batch = args.batch or min(len(sources), MAX_BATCH)
    segmenters = {n: HysteresisSegmenter(args.threshold, max(0.0, args.threshold - 0.15)) for n in sources}
    found: dict[str, list[tuple[float, float]]] = {n: [] for n in sources}

    def report(name: str, segs: list[tuple[float, float]]) -> None:
        for s, e in segs:
            found[name].append((s, e))
            print(f"{name}: speech {s:.0f}-{e:.0f} ms")

    def consume(results) -> None:
        # With batching, a push returns windows of whichever streams ran: route them by stream_id.
        for w in results:
            p = float(w.outputs["output"][0, 0])
            start, end = new_audio_span(w)  # the window's 512 new samples (64 are context)
            if args.verbose:
                print(f"{w.stream_id}: {start:8.0f} ms  p={p:.6f}")
            report(w.stream_id, segmenters[w.stream_id].update(p, start, end))

    pos = dict.fromkeys(sources, 0)  # samples pushed per stream: its clock
    try:
        with model, StreamRouter(model, VAD_OPTIONS, max_streams=max(1, len(sources)), eviction="error",
                                 constants=VAD_CONSTANTS, batch_size=batch) as router:  # fmt: skip
            live = dict(sources)
            while live:  # one chunk of every stream per round: interleaved, as live capture would be
                full: list[tuple[str, np.ndarray]] = []  # --block: this round's whole chunks
                for name, chunks in list(live.items()):
                    x = next(chunks, None)
                    if x is None or (limit is not None and pos[name] >= limit):
                        del live[name]
                        consume(router.close(name))  # runs its queued windows (and others') first
                        report(name, segmenters[name].finish())
                        continue
                    if args.block and len(x) == HOP:
                        full.append((name, x))
                        continue
                    consume(router.push(name, x, pos[name] * 1000.0 / SR))
                    pos[name] += len(x)
                if full:  # every stream's chunk in one call; the windows come back as columns
                    ids = [n for n, _ in full]
                    block = router.push_block(ids, np.stack([x for _, x in full]), [pos[n] * 1000.0 / SR for n in ids])
                    consume(block.windows())
                    for n in ids:
                        pos[n] += HOP
    except KeyboardInterrupt:
        for name, seg in segmenters.items():  # (the router's exit ran the queued windows)
            report(name, seg.finish())
    except (edge_sdk.EdgeSDKError, OSError) as e:  # a model error, an unreadable --raw file ...
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=5)

    print()
    for name, segs in found.items():
        speech = sum(e - s for s, e in segs) / 1000
        print(f"summary {name}: {len(segs)} segment(s), {speech:.2f} s of speech in {pos[name] / SR:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
