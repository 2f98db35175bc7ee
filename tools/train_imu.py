"""Train the IMU activity/anomaly model of samples/imu_anomaly.py and write its package and demo CSV.

Data (made here, numpy only, seeds fixed): a 6-axis IMU (accelerometer in g, gyroscope in
rad/s) sampled at 50 Hz, worn or held in a random orientation. The accelerometer measures
specific force, so a device at rest reads 1 g against gravity along whatever axis points up;
every activity is simulated in the world frame (z up) and rotated into the sensor frame:

* ``still``: at rest (table, hand): gravity only, plus a faint tremor.
* ``walking``: steps at 1.6-2.2 Hz; vertical bounce 0.15-0.35 g with its 2nd harmonic, fore/aft
  sway at the step rate, lateral sway at half of it; body rotation 0.3-0.8 rad/s.
* ``running``: steps at 2.5-3.2 Hz; peaky vertical bounce 0.8-1.6 g (near free fall in the
  flight phase), larger sway; body rotation 1.5-3 rad/s.
* ``shaking``: shaken by hand at 4-8 Hz along a random direction, 1.2-3 g; 3-6 rad/s rotation.

The step rate wanders (a random walk of the phase), and every segment gets its own sensor
bias (accelerometer +-0.03 g, gyroscope +-0.02 rad/s per axis) on top of white noise (0.01 g,
0.005 rad/s); readings saturate at the sensor's range (+-16 g, +-17.45 rad/s = 1000 deg/s).
Segments follow each other with a 0.5 s crossfade (a person picks the device up, starts to
run ...). The anomaly, never seen in training, is a ``drop``: 0.35 s of free fall (0 g,
tumbling at 5-10 rad/s), an impact ringing at 8-15 g for 0.1 s, then rest in a new orientation.

Model (ONNX, opset 17; input ``imu`` float32 [batch, 100, 6] = 2 s at 50 Hz, channels
ax ay az gx gy gz): orientation-independent features computed in the graph from the
magnitudes |a| and |w| (mean, std, max, min of |a|; mean, std, max of |w|; std of the
sample-to-sample differences of both), log-scaled and standardised, then

* ``logits`` [batch, 4]: a 10-16-4 ReLU MLP (trained here with full-batch Adam in numpy),
  decoded as classification over still / walking / running / shaking;
* ``anomaly`` [batch, 1]: the distance of the features to the nearest activity (Mahalanobis
  under that activity's full-covariance Gaussian, per feature), divided by the threshold fitted on normal
  windows (a high quantile of all training windows, transitions included): > 1 is anomalous.

Accuracy is measured by running the written ONNX in ONNX Runtime on a held-out set made with
another seed, and recorded in the manifest (``[variants.quality]``).

Reproduce the committed files (a few seconds)::

    python tools/train_imu.py          # writes samples/data/imu-activity/ and samples/data/imu_demo.csv

The package is committed (a few KB) so the sample runs without the ``onnx`` package, which only
this script needs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RATE = 50  # Hz
WINDOW = 100  # samples per model call (2 s)
HOP = 50  # the sample's hop (1 s)
TRAIN_HOP = 25
LABELS = ("still", "walking", "running", "shaking")
FEATURES = (
    "acc_mean", "acc_std", "acc_max", "acc_min", "gyro_mean", "gyro_std", "gyro_max", "acc_jerk", "gyro_jerk",
)  # fmt: skip
EPS = 1e-3  # added before the log
HIDDEN = 16
SEED = 7
ACC_RANGE, GYRO_RANGE = 16.0, 17.45
ANOMALY_QUANTILE, ANOMALY_MARGIN = 0.998, 1.25
COV_RIDGE = 0.0025  # added to each activity's feature covariance (standardised units)
DEFAULT_OUT = ROOT / "samples" / "data"
PACKAGE_DIR, ONNX_NAME, DEMO_CSV = "imu-activity", "imu_activity.onnx", "imu_demo.csv"
CSV_HEADER = "t_s,ax_g,ay_g,az_g,gx_rad_s,gy_rad_s,gz_rad_s"
PRODUCER = "edge_sdk tools/train_imu.py"

# The demo recording: (activity, seconds). The drop happens at DEMO_DROP_S (its free fall starts there).
DEMO_SCHEDULE = (("still", 12.0), ("walking", 20.0), ("running", 15.0), ("walking", 8.0), ("shaking", 10.0), ("still", 9.0), ("drop", 0.5), ("still", 10.5))  # fmt: skip
DEMO_DROP_S = sum(d for _, d in DEMO_SCHEDULE[:6])
DEMO_SEED = 2024


# --- simulation -----------------------------------------------------------------------------


def _rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly random 3-D rotation (QR of a Gaussian matrix, sign-fixed)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def _phase(rng: np.random.Generator, n: int, f: float) -> np.ndarray:
    """2*pi*f*t with a wandering rate (people do not step like a metronome)."""
    df = np.cumsum(rng.normal(0, 0.02, n)) / np.sqrt(RATE)
    return 2 * np.pi * np.cumsum(np.clip(f + df, 0.7 * f, 1.3 * f)) / RATE + rng.uniform(0, 2 * np.pi)


def segment(kind: str, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """``seconds`` of one activity: [n, 6] float64, sensor frame (acc g, gyro rad/s), no noise."""
    n = int(round(seconds * RATE))
    acc_w = np.zeros((n, 3))  # world-frame linear acceleration (g), z up
    gyro_b = np.zeros((n, 3))  # body rotation rate (rad/s)
    R = _rotation(rng)
    if kind == "still":
        acc_w += rng.normal(0, 0.004, (n, 3))  # faint tremor
        gyro_b += rng.normal(0, 0.004, (n, 3))
    elif kind in ("walking", "running"):
        run = kind == "running"
        f = rng.uniform(2.5, 3.2) if run else rng.uniform(1.6, 2.2)
        ph = _phase(rng, n, f)
        if run:  # push-off peaks and a flight phase: a clipped, peaky bounce
            a = rng.uniform(0.8, 1.6)
            v = np.maximum(np.sin(ph), 0) ** 2
            acc_w[:, 2] = a * (v - v.mean()) * 2.2
        else:
            a = rng.uniform(0.15, 0.35)
            acc_w[:, 2] = a * (np.sin(ph) + 0.3 * np.sin(2 * ph + rng.uniform(0, 6.3)))
        acc_w[:, 0] = 0.5 * a * np.sin(ph + rng.uniform(0, 6.3))  # fore/aft
        acc_w[:, 1] = 0.3 * a * np.sin(ph / 2 + rng.uniform(0, 6.3))  # lateral, every other step
        w = rng.uniform(1.5, 3.0) if run else rng.uniform(0.3, 0.8)
        for k in range(3):
            gyro_b[:, k] = w * rng.uniform(0.3, 1.0) * np.sin((ph if k != 1 else ph / 2) + rng.uniform(0, 6.3))
    elif kind == "shaking":
        f = rng.uniform(4.0, 8.0)
        ph = _phase(rng, n, f)
        d = rng.normal(size=3)
        acc_w += np.outer(rng.uniform(1.2, 3.0) * np.sin(ph), d / np.linalg.norm(d))
        axis = rng.normal(size=3)
        gyro_b += np.outer(rng.uniform(3.0, 6.0) * np.sin(ph + 1.0), axis / np.linalg.norm(axis))
        gyro_b += rng.normal(0, 0.3, (n, 3))
    elif kind == "drop":  # free fall, impact, then at rest (the caller's next segment)
        fall = int(0.35 * RATE)
        acc_w[:fall, 2] = -1.0  # falling with gravity: specific force ~0
        gyro_b[:fall] = rng.uniform(5, 10) * (lambda d: d / np.linalg.norm(d))(rng.normal(size=3))
        k = np.arange(n - fall) / RATE
        ring = rng.uniform(8, 15) * np.exp(-k / 0.03) * np.cos(2 * np.pi * 20 * k)
        acc_w[fall:, 2] = ring
        acc_w[fall:, 0] = 0.4 * ring * rng.uniform(-1, 1)
        gyro_b[fall:] = rng.normal(0, 2.0, (n - fall, 3)) * np.exp(-k / 0.05)[:, None]
    else:
        raise ValueError(f"unknown activity {kind!r}; expected one of {LABELS + ('drop',)}")
    specific = acc_w + np.array([0.0, 0.0, 1.0])  # what an accelerometer reads: a - g
    return np.concatenate([specific @ R, gyro_b], axis=1)  # rows @ R = R^T applied: world -> sensor


def simulate(schedule: list[tuple[str, float]] | tuple, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A recording of consecutive segments: (labels per sample as indices into LABELS,
    -1 for ``drop``; readings [n, 6] float64 with bias, noise and saturation)."""
    rng = np.random.default_rng(seed)
    fade = int(0.5 * RATE)
    parts: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for kind, seconds in schedule:
        x = segment(kind, seconds, rng)
        x[:, :3] += rng.uniform(-0.03, 0.03, 3)  # per-segment sensor bias
        x[:, 3:] += rng.uniform(-0.02, 0.02, 3)
        if parts and kind != "drop" and parts[-1].shape[0] >= fade and x.shape[0] >= fade:
            if labels[-1][0] != -1:  # no crossfade after a drop: the device is at rest at once
                w = np.linspace(0, 1, fade)[:, None]
                x[:fade] = (1 - w) * parts[-1][-fade:] + w * x[:fade]
        parts.append(x)
        labels.append(np.full(len(x), LABELS.index(kind) if kind in LABELS else -1))
    x = np.concatenate(parts)
    x[:, :3] += rng.normal(0, 0.01, (len(x), 3))
    x[:, 3:] += rng.normal(0, 0.005, (len(x), 3))
    x[:, :3] = np.clip(x[:, :3], -ACC_RANGE, ACC_RANGE)
    x[:, 3:] = np.clip(x[:, 3:], -GYRO_RANGE, GYRO_RANGE)
    return np.concatenate(labels), x


def random_schedule(rng: np.random.Generator, minutes: float) -> list[tuple[str, float]]:
    out, total = [], 0.0
    while total < minutes * 60:
        s = float(rng.uniform(6, 20))
        out.append((LABELS[int(rng.integers(len(LABELS)))], s))
        total += s
    return out


def windows(y: np.ndarray, x: np.ndarray, hop: int = TRAIN_HOP, purity: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Windows [m, WINDOW, 6] float32 and their labels (-1: no activity covers ``purity`` of it)."""
    starts = np.arange(0, len(x) - WINDOW + 1, hop)
    X = np.stack([x[s : s + WINDOW] for s in starts]).astype(np.float32)
    Y = np.full(len(starts), -1)
    for i, s in enumerate(starts):
        counts = np.bincount(y[s : s + WINDOW] + 1, minlength=len(LABELS) + 1)[1:]
        if counts.max() >= purity * WINDOW and (y[s : s + WINDOW] >= 0).all():
            Y[i] = int(counts.argmax())
    return X, Y


# --- features (the graph computes exactly these) ------------------------------------------------


def features(X: np.ndarray) -> np.ndarray:
    """[m, WINDOW, 6] -> log features [m, 9] (float32), as the ONNX graph computes them."""
    X = X.astype(np.float32)
    am = np.sqrt((X[:, :, :3] ** 2).sum(-1))
    gm = np.sqrt((X[:, :, 3:] ** 2).sum(-1))

    def std(v):
        return np.sqrt(((v - v.mean(1, keepdims=True)) ** 2).mean(1))

    f = np.stack([am.mean(1), std(am), am.max(1), am.min(1), gm.mean(1), std(gm), gm.max(1), std(np.diff(am, axis=1)), std(np.diff(gm, axis=1))], 1)
    return np.log(f + np.float32(EPS)).astype(np.float32)


# --- training (numpy) -----------------------------------------------------------------------------


def train(F: np.ndarray, Y: np.ndarray, seed: int, steps: int = 1500, lr: float = 0.01, wd: float = 1e-4) -> dict[str, np.ndarray]:
    """Standardise, fit the MLP (full-batch Adam on cross-entropy) and the per-class Gaussians."""
    mu, sd = F.mean(0), F.std(0) + 1e-6
    Z = ((F - mu) / sd).astype(np.float64)
    rng = np.random.default_rng(seed)
    k = len(LABELS)
    p = {
        "w1": rng.normal(0, np.sqrt(2 / Z.shape[1]), (Z.shape[1], HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(0, np.sqrt(1 / HIDDEN), (HIDDEN, k)),
        "b2": np.zeros(k),
    }
    m = {n: np.zeros_like(v) for n, v in p.items()}
    v2 = {n: np.zeros_like(v) for n, v in p.items()}
    onehot = np.eye(k)[Y]
    for step in range(1, steps + 1):
        h = np.maximum(Z @ p["w1"] + p["b1"], 0)
        logits = h @ p["w2"] + p["b2"]
        e = np.exp(logits - logits.max(1, keepdims=True))
        prob = e / e.sum(1, keepdims=True)
        g = (prob - onehot) / len(Z)
        grads = {"w2": h.T @ g, "b2": g.sum(0)}
        gh = (g @ p["w2"].T) * (h > 0)
        grads.update({"w1": Z.T @ gh, "b1": gh.sum(0)})
        for n in p:
            gr = grads[n] + (wd * p[n] if n.startswith("w") else 0)
            m[n] = 0.9 * m[n] + 0.1 * gr
            v2[n] = 0.999 * v2[n] + 0.001 * gr * gr
            p[n] -= lr * (m[n] / (1 - 0.9**step)) / (np.sqrt(v2[n] / (1 - 0.999**step)) + 1e-8)
    # One Gaussian per activity, full covariance (features move together: a window with the max
    # of shaking but the mean of rest is what a drop looks like), regularised; stored as a
    # whitening matrix L (inverse covariance = L L^T), so distance^2 = |(z - mean) L|^2.
    cm = np.stack([Z[Y == c].mean(0) for c in range(k)])
    cw = np.stack([np.linalg.cholesky(np.linalg.inv(np.cov(Z[Y == c].T) + COV_RIDGE * np.eye(Z.shape[1]))) for c in range(k)])
    out = {n: v.astype(np.float32) for n, v in p.items()}
    out.update(mu=mu.astype(np.float32), sd=sd.astype(np.float32), class_mean=cm.astype(np.float32), class_whiten=cw.astype(np.float32))
    return out


def anomaly_distance(F: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    """Mahalanobis distance to the nearest activity's Gaussian, per feature (RMS), as in the graph."""
    Z = (F - p["mu"]) / p["sd"]
    w = np.einsum("bkf,kfg->bkg", Z[:, None, :] - p["class_mean"][None], p["class_whiten"])
    return np.sqrt((w**2).mean(2).min(1))


# --- the ONNX graph -------------------------------------------------------------------------------


def build_onnx(p: dict[str, np.ndarray], threshold: float) -> Any:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c: list[Any] = []

    def const(name: str, v: Any, dtype: Any = np.float32) -> str:
        c.append(numpy_helper.from_array(np.asarray(v, dtype), name))
        return name

    n = helper.make_node
    nodes = [
        n("Slice", ["imu", const("s0", [0], np.int64), const("s3", [3], np.int64), const("ax2", [2], np.int64)], ["acc"]),
        n("Slice", ["imu", "s3", const("s6", [6], np.int64), "ax2"], ["gyro"]),
    ]
    feats = []
    for src, pre in (("acc", "a"), ("gyro", "g")):
        nodes += [
            n("Mul", [src, src], [f"{pre}_sq"]),
            n("ReduceSum", [f"{pre}_sq", "ax2"], [f"{pre}_ss"], keepdims=0),
            n("Sqrt", [f"{pre}_ss"], [f"{pre}_m"]),  # |a| or |w| per sample: [batch, T]
            n("ReduceMean", [f"{pre}_m"], [f"{pre}_mean"], axes=[1], keepdims=1),
            n("Sub", [f"{pre}_m", f"{pre}_mean"], [f"{pre}_c"]),
            n("Mul", [f"{pre}_c", f"{pre}_c"], [f"{pre}_c2"]),
            n("ReduceMean", [f"{pre}_c2"], [f"{pre}_var"], axes=[1], keepdims=1),
            n("Sqrt", [f"{pre}_var"], [f"{pre}_std"]),
            n("ReduceMax", [f"{pre}_m"], [f"{pre}_max"], axes=[1], keepdims=1),
            n("ReduceMin", [f"{pre}_m"], [f"{pre}_min"], axes=[1], keepdims=1),
            # sample-to-sample differences ("jerk"): rises with frequency x amplitude
            n("Slice", [f"{pre}_m", const(f"{pre}_one", [1], np.int64), const(f"{pre}_end", [WINDOW], np.int64), const(f"{pre}_ax1", [1], np.int64)], [f"{pre}_hi"]),
            n("Slice", [f"{pre}_m", "s0", const(f"{pre}_last", [WINDOW - 1], np.int64), f"{pre}_ax1"], [f"{pre}_lo"]),
            n("Sub", [f"{pre}_hi", f"{pre}_lo"], [f"{pre}_d"]),
            n("ReduceMean", [f"{pre}_d"], [f"{pre}_dmean"], axes=[1], keepdims=1),
            n("Sub", [f"{pre}_d", f"{pre}_dmean"], [f"{pre}_dc"]),
            n("Mul", [f"{pre}_dc", f"{pre}_dc"], [f"{pre}_dc2"]),
            n("ReduceMean", [f"{pre}_dc2"], [f"{pre}_dvar"], axes=[1], keepdims=1),
            n("Sqrt", [f"{pre}_dvar"], [f"{pre}_jerk"]),
        ]
    feats = ["a_mean", "a_std", "a_max", "a_min", "g_mean", "g_std", "g_max", "a_jerk", "g_jerk"]
    nodes += [
        n("Concat", feats, ["f_raw"], axis=1),  # [batch, 9]
        n("Add", ["f_raw", const("eps", EPS)], ["f_eps"]),
        n("Log", ["f_eps"], ["f_log"]),
        n("Sub", ["f_log", const("mu", p["mu"])], ["f_c"]),
        n("Div", ["f_c", const("sd", p["sd"])], ["z"]),
        n("MatMul", ["z", const("w1", p["w1"])], ["h_mm"]),
        n("Add", ["h_mm", const("b1", p["b1"])], ["h_pre"]),
        n("Relu", ["h_pre"], ["h"]),
        n("MatMul", ["h", const("w2", p["w2"])], ["o_mm"]),
        n("Add", ["o_mm", const("b2", p["b2"])], ["logits"]),
        n("Unsqueeze", ["z", "ax1_"], ["z3"]),  # [batch, 1, 9] against [classes, 9]
        n("Sub", ["z3", const("cmean", p["class_mean"])], ["zd"]),
        n("Unsqueeze", ["zd", "ax2"], ["zd4"]),  # [batch, classes, 1, 9]
        n("MatMul", ["zd4", const("cwhiten", p["class_whiten"])], ["zw"]),  # x [classes, 9, 9]
        n("Mul", ["zw", "zw"], ["zw2"]),
        n("ReduceMean", ["zw2"], ["dist2"], axes=[2, 3], keepdims=0),  # [batch, classes]
        n("ReduceMin", ["dist2"], ["dmin2"], axes=[1], keepdims=1),  # [batch, 1]
        n("Sqrt", ["dmin2"], ["dmin"]),
        n("Div", ["dmin", const("threshold", threshold)], ["anomaly"]),
    ]
    const("ax1_", [1], np.int64)
    graph = helper.make_graph(
        nodes,
        "imu_activity",
        [helper.make_tensor_value_info("imu", TensorProto.FLOAT, ["batch", WINDOW, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)]), helper.make_tensor_value_info("anomaly", TensorProto.FLOAT, ["batch", 1])],
        c,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=PRODUCER)
    model.ir_version = 8
    model.doc_string = "IMU activity (still/walking/running/shaking) and anomaly score, 2 s at 50 Hz; trained by tools/train_imu.py"
    onnx.checker.check_model(model, full_check=True)
    return model


def run_onnx(data: bytes, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    logits, anomaly = s.run(["logits", "anomaly"], {"imu": X.astype(np.float32)})
    return logits, anomaly[:, 0]


def manifest(quality: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {
        "schema": 1,
        "name": "imu-activity",
        "version": "1.0.0",
        "task": "classification",
        "description": (
            f"6-axis IMU (acc g, gyro rad/s) at {RATE} Hz, {WINDOW}-sample windows: activity logits and an anomaly score "
            f"(distance to the nearest activity / {threshold:.3f}; > 1 is anomalous). Trained by tools/train_imu.py on synthetic data."
        ),
        "labels": list(LABELS),
        "decoder": {"kind": "classification", "output": "logits", "softmax": True, "top_k": 1},
        "inputs": [{"name": "imu", "dtype": "float32", "shape": ["batch", WINDOW, 6], "layout": "NLC", "dims": {"batch": [1, 64]}}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", len(LABELS)]}, {"name": "anomaly", "dtype": "float32", "shape": ["batch", 1]}],
        "variants": [{"id": "fp32-onnx", "file": ONNX_NAME, "backend": "onnxruntime", "precision": "fp32", "quality": quality}],
    }


def demo_csv() -> str:
    """The demo recording (DEMO_SCHEDULE, seed DEMO_SEED) as CSV text, timestamps from 0 s."""
    _, x = simulate(DEMO_SCHEDULE, DEMO_SEED)
    lines = [CSV_HEADER]
    lines += [f"{i / RATE:.2f}," + ",".join(f"{v:.4f}" for v in row) for i, row in enumerate(x)]
    return "\n".join(lines) + "\n"


def build(out: Path, seed: int = SEED, minutes: float = 40.0, log: bool = True) -> dict[str, Any]:
    """Train, write ``out/imu-activity/`` (package) and ``out/imu_demo.csv``; return the figures."""
    from converters.packaging import write_package

    rng = np.random.default_rng(seed)
    y, x = simulate(random_schedule(rng, minutes), seed + 1)
    X, Y = windows(y, x)
    F = features(X)
    p = train(F[Y >= 0], Y[Y >= 0], seed + 2)
    # The threshold: normal windows (every window of the training recording, transitions too) score <= 1/margin.
    threshold = float(np.quantile(anomaly_distance(F, p), ANOMALY_QUANTILE) * ANOMALY_MARGIN)
    data = build_onnx(p, threshold).SerializeToString()
    # Held out: another recording, another seed, measured on the ONNX file itself.
    hy, hx = simulate(random_schedule(np.random.default_rng(seed + 100), minutes / 4), seed + 101)
    HX, HY = windows(hy, hx, hop=HOP)
    logits, score = run_onnx(data, HX[HY >= 0])
    acc = float((logits.argmax(1) == HY[HY >= 0]).mean())
    false_alarms = float((run_onnx(data, HX)[1] > 1).mean())
    # Drops in the middle of still/walking: how many of their windows are flagged.
    sched: list[tuple[str, float]] = []
    for i in range(8):
        sched += [(LABELS[i % 3], 6.0), ("drop", 0.5), ("still", 4.0)]
    dy, dx = simulate(sched, seed + 200)
    fall = np.flatnonzero(np.diff((dy == -1).astype(int)) == 1) + 1
    hit = [bool((run_onnx(data, dx[None, f - WINDOW // 2 : f + WINDOW // 2].astype(np.float32))[1] > 1).all()) for f in fall]
    quality = {"metric": "accuracy", "value": round(acc, 4), "samples": int((HY >= 0).sum()), "dataset": f"synthetic IMU, seed {seed + 101}, {HOP}-sample hop"}
    pkg = out / PACKAGE_DIR
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / ONNX_NAME
        f.write_bytes(data)
        write_package(pkg, manifest(quality, threshold), {ONNX_NAME: f}, overwrite=True)
    (out / DEMO_CSV).write_text(demo_csv())
    figures = {"accuracy": acc, "holdout_windows": int((HY >= 0).sum()), "false_alarm_rate": false_alarms, "drops_detected": f"{sum(hit)}/{len(hit)}", "threshold": threshold, "train_windows": int((Y >= 0).sum())}
    if log:
        print(figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Train the IMU activity/anomaly model; write its package and the demo CSV")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for imu-activity/ and imu_demo.csv (default samples/data)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--minutes", type=float, default=40.0, help="minutes of simulated training recording")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    build(a.out, a.seed, a.minutes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
