"""Activity and anomaly detection on a live IMU stream (accelerometer + gyroscope), with edge_sdk.

    python samples/imu_anomaly.py [CSV | -] [--package DIR] [--follow] [--strict]

Input: CSV rows ``t, ax, ay, az, gx, gy, gz`` (t in seconds unless --time-unit says otherwise,
acceleration in g, rotation rate in rad/s) at 50 Hz, optionally under a header line. With no
arguments it replays samples/data/imu_demo.csv. Rows are read one at a time, as if they were
arriving from the sensor: ``--follow`` keeps reading a file an IMU logger is still writing, and
``-`` reads stdin (e.g. ``imu-logger | python samples/imu_anomaly.py -``).

Every 1 s it classifies the last 2 s (still / walking / running / shaking) and prints an
anomaly score (> 1: like none of those, e.g. a drop). Missing time (a gap in the timestamps)
and malformed rows are reported where they happen; ``--strict`` stops at the first one
(exit 1). The model is samples/data/imu-activity, trained by tools/fixtures/train_imu.py.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np

import edge_sdk
from edge_sdk.streams import SignalStream, SignalStreamOptions

DATA = Path(__file__).resolve().parent / "data"
RATE_HZ, WINDOW, HOP, CHANNELS = 50, 100, 50, 6  # what the model was trained on: 2 s windows
UNITS_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001}


class CsvRowError(edge_sdk.errors.InputError):
    """A CSV row that is not 7 finite numbers (t, ax, ay, az, gx, gy, gz)."""


class SampleRateError(edge_sdk.errors.InputError):
    """The recording's sample rate is not the model's."""


def parse_row(line: str, lineno: int) -> tuple[float, np.ndarray]:
    fields = line.strip().split(",")
    if len(fields) != 1 + CHANNELS:
        raise CsvRowError(f"line {lineno}: expected 7 comma-separated numbers (t,ax,ay,az,gx,gy,gz), got {len(fields)} field(s): {line.strip()[:60]!r}")
    try:
        values = [float(f) for f in fields]
    except ValueError:
        raise CsvRowError(f"line {lineno}: expected 7 numbers (t,ax,ay,az,gx,gy,gz), got {line.strip()[:60]!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise CsvRowError(f"line {lineno}: expected finite numbers, got {line.strip()[:60]!r}")
    # One sample as [1, channels] float32: the stream never casts, so the dtype must match.
    return values[0], np.array([values[1:]], dtype=np.float32)


def read_lines(source: str, follow: bool, idle_exit_s: float) -> Iterator[str]:
    """Lines as they become available. A file being written may end in half a line: with
    --follow that part is kept until its newline arrives."""
    f = sys.stdin if source == "-" else open(source, encoding="utf-8", newline="")
    partial, idle_since = "", time.monotonic()
    with f:
        while True:
            line = f.readline()
            if line:
                idle_since = time.monotonic()
                if follow and not line.endswith("\n"):
                    partial += line
                    continue
                yield partial + line
                partial = ""
            elif not follow or source == "-":  # stdin: readline blocks; "" is the end
                if partial:
                    yield partial
                return
            elif idle_exit_s and time.monotonic() - idle_since > idle_exit_s:
                return
            else:
                time.sleep(0.05)  # nothing new yet: poll the growing file


def read_rows(args: argparse.Namespace, counts: Counter) -> Iterator[tuple[float, np.ndarray]]:
    """(timestamp in ms, sample) per data row; malformed rows are reported (or raised with --strict)."""
    for lineno, line in enumerate(read_lines(args.csv, args.follow, args.idle_exit), 1):
        if not line.strip():
            continue
        if lineno == 1 and line.lstrip()[:1].isalpha():
            continue  # a header line
        try:
            t, sample = parse_row(line, lineno)
        except CsvRowError as e:
            if args.strict:
                raise
            counts["malformed"] += 1
            print(f"MALFORMED {e} (row skipped)")
            continue
        yield t * UNITS_MS[args.time_unit], sample


def checked_rate(rows: Iterator[tuple[float, np.ndarray]], n: int = 10) -> Iterator[tuple[float, np.ndarray]]:
    """Pass rows through once the first ``n`` intervals say the rate is the model's: a 100 Hz
    log fed to a 50 Hz model would otherwise show up as thousands of "overlap" events."""
    head = []
    for row in rows:
        head.append(row)
        if len(head) > n:
            break
    if len(head) > 2:
        dt = float(np.median(np.diff([t for t, _ in head])))
        if not 0.8 * 1000 / RATE_HZ <= dt <= 1.2 * 1000 / RATE_HZ:
            raise SampleRateError(
                f"expected {RATE_HZ} Hz samples ({1000 / RATE_HZ:.0f} ms apart), the first rows are {dt:.2f} ms apart "
                f"({1000 / dt if dt > 0 else math.inf:.1f} Hz); resample the log or check --time-unit"
            )
    yield from head
    yield from rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?", default=str(DATA / "imu_demo.csv"), help="CSV file, or - for stdin (default: the demo recording)")
    ap.add_argument("--package", default=str(DATA / "imu-activity"), help="model package (default: samples/data/imu-activity)")
    ap.add_argument("--follow", action="store_true", help="keep reading the file as it grows (like tail -f)")
    ap.add_argument("--idle-exit", type=float, default=0.0, metavar="S", help="with --follow: stop after S seconds without new rows (0: never)")
    ap.add_argument("--time-unit", choices=sorted(UNITS_MS), default="s", help="unit of the t column (default s)")
    ap.add_argument("--threshold", type=float, default=1.0, help="anomaly score above which a window is flagged (default 1.0)")
    ap.add_argument("--strict", action="store_true", help="stop (exit 1) at the first malformed row or timestamp gap")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # live output when piped

    try:
        model = edge_sdk.load(args.package)
    except edge_sdk.EdgeSDKError as e:
        print(f"cannot load {args.package}: {e}", file=sys.stderr)
        return 1
    # Windows of 2 s every 1 s. A gap resets the window (zero-filling would look like free fall);
    # --strict turns gaps and out-of-order rows into errors instead of reported events.
    opts = SignalStreamOptions(
        sample_rate_hz=RATE_HZ, window=WINDOW, hop=HOP, channels=CHANNELS, layout="NTC",
        gap_policy="error" if args.strict else "reset",
        out_of_order_policy="error" if args.strict else "drop",
        timestamp_tolerance_ms=5.0,  # loggers jitter by a few ms; more than that is missing data
    )  # fmt: skip
    labels = Counter()
    anomalies: list[tuple[float, float, float]] = []  # merged (start s, end s, peak score)
    counts = Counter()  # rows, malformed rows, gaps
    try:
        with model, SignalStream(model, opts, stream_id=args.csv) as stream:
            t0: float | None = None
            for t_ms, sample in checked_rate(read_rows(args, counts)):
                t0 = t_ms if t0 is None else t0
                counts["rows"] += 1
                for w in stream.push(sample, t_ms):
                    start, end = (w.timestamp_ms - t0) / 1000, (w.end_ms - t0) / 1000
                    top = w.result.top1  # the decoder: softmax over the labels
                    score = float(w.outputs["anomaly"][0, 0])
                    labels[top.label] += 1
                    flag = ""
                    if score > args.threshold:
                        flag = "  << ANOMALY"
                        if anomalies and start <= anomalies[-1][1]:  # overlaps the previous one: same event
                            s, _, peak = anomalies[-1]
                            anomalies[-1] = (s, end, max(peak, score))
                        else:
                            anomalies.append((start, end, score))
                    print(f"{start:8.2f}-{end:8.2f} s  {top.label:<8} {top.score:.2f}  anomaly {score:5.2f}{flag}")
                for ev in stream.pop_events():  # gaps, overlaps, out-of-order rows: said, never silent
                    counts["gaps"] += ev.kind == "gap"
                    print(f"{ev.kind.upper()} at {(ev.timestamp_ms - t0) / 1000:.2f} s: {ev.detail}")
    except edge_sdk.EdgeSDKError as e:  # CsvRowError, SampleRateError, GapError, TimestampError, model errors
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot read {args.csv}: {e}", file=sys.stderr)
        return 1

    n = sum(labels.values())
    print(f"\nsummary: {counts['rows']} rows, {n} windows ({', '.join(f'{k} {v}' for k, v in labels.most_common()) or 'none'})")
    print(f"gaps: {counts['gaps']}, malformed rows: {counts['malformed']}")
    print(f"anomalies: {len(anomalies)}" + "".join(f"\n  {s:.2f}-{e:.2f} s (peak score {p:.2f})" for s, e, p in anomalies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
