"""Train a MatMul-heavy MLP on the shapes data and write it as a plain ONNX graph.

The model exists for int4 weight-only quantization (ONNX Runtime's
``MatMulNBits``) tests and the int4 benchmark: three ``MatMul`` nodes whose B is
a constant 2-D fp32 initializer ``[K, N]`` (ORT's ``MatMulNBitsQuantizer``
handles only that form, not ``Gemm``), each followed by ``Add`` (bias) and, for
the first two, ``Relu``::

    x [batch, 1024] -> MatMul 1024x512 -> Add -> Relu
                    -> MatMul 512x512  -> Add -> Relu
                    -> MatMul 512x4    -> Add -> logits [batch, 4]

Data: the shapes images of :func:`tools.train_demo.make_split` (circle, square,
triangle, cross; RGB uint8 64x64), turned into model input by :func:`preprocess`:
grayscale (OpenCV's RGB->GRAY), resized to 32x32 with ``cv2.INTER_AREA``,
flattened row-major to 1024, scaled to [0, 1] and shifted by -0.5.

Training (PyTorch, CPU, seeds fixed): AdamW with a one-cycle learning rate,
batch 128, and augmentations that leave the label unchanged: the eight
flips/transposes of the 32x32 grid (every class is drawn at a uniform random
angle) and polarity inversion (the shape can be lighter or darker than the
background).  Splits, all from ``make_split``:

* train: seed ``SEED``, ``--train`` images;
* test: seed ``SEED + 1``, ``--test`` images (the accuracy figure to quote);
* holdout: seed ``SEED + 2``, 256 images, written preprocessed to
  ``shapes_mlp_holdout.npz`` so tests can check the ONNX without drawing.

Accuracies are measured by running the written ONNX file in ONNX Runtime (CPU),
not the torch module, so a test re-running the file gets the same figure.

Reproduce the committed files (about 10 minutes on two cores)::

    python tools/train_mlp.py            # writes tools/data/shapes_mlp*.{onnx,json,npz}

Usage::

    python tools/train_mlp.py [--epochs E] [--train N] [--test N] [--seed S] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.train_demo import LABELS, make_split  # noqa: E402

__all__ = [
    "SIDE", "FEATURES", "HIDDEN", "HOLDOUT_N", "DEFAULT_OUT", "ONNX_NAME", "JSON_NAME", "HOLDOUT_NAME",
    "PRODUCER", "preprocess", "build_onnx", "train", "evaluate", "main",
]  # fmt: skip

SIDE = 32  # model input is SIDE x SIDE grayscale, flattened
FEATURES = SIDE * SIDE  # 1024
HIDDEN = (512, 512)
HOLDOUT_N = 256
BATCH = 128
DEFAULT_OUT = ROOT / "tools" / "data"
ONNX_NAME = "shapes_mlp_fp32.onnx"
JSON_NAME = "shapes_mlp.json"
HOLDOUT_NAME = "shapes_mlp_holdout.npz"
PRODUCER = "edge_sdk tools/train_mlp.py"
OPSET = 17
IR_VERSION = 8


def preprocess(images: np.ndarray) -> np.ndarray:
    """RGB uint8 images ``[N, H, W, 3]`` (or one ``[H, W, 3]``) -> float32 ``[N, 1024]``.

    Grayscale with ``cv2.COLOR_RGB2GRAY``, resize to 32x32 with ``cv2.INTER_AREA``,
    flatten row-major, ``/ 255`` and ``- 0.5`` (values in [-0.5, 0.5]).
    """
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected RGB images [N, H, W, 3] or [H, W, 3], got shape {images.shape}")
    if images.dtype != np.uint8:
        raise ValueError(f"expected uint8 images, got {images.dtype}")
    out = np.empty((len(images), FEATURES), np.float32)
    for i, im in enumerate(images):
        gray = cv2.cvtColor(np.ascontiguousarray(im), cv2.COLOR_RGB2GRAY)
        small = cv2.resize(gray, (SIDE, SIDE), interpolation=cv2.INTER_AREA)
        out[i] = small.reshape(-1)
    out /= np.float32(255.0)
    out -= np.float32(0.5)
    return out


def _augment(xb: Any, gen: Any) -> Any:
    """Random dihedral transform of the 32x32 grid and random polarity, per batch/sample."""
    import torch

    n = len(xb)
    g = xb.view(n, SIDE, SIDE)
    r = torch.rand(3, generator=gen)
    if r[0] < 0.5:
        g = g.flip(2)
    if r[1] < 0.5:
        g = g.flip(1)
    if r[2] < 0.5:
        g = g.transpose(1, 2)
    sign = torch.where(torch.rand(n, 1, 1, generator=gen) < 0.5, -1.0, 1.0)
    return (g * sign).reshape(n, FEATURES)


def train(xtr: np.ndarray, ytr: np.ndarray, epochs: int, seed: int, *, lr: float = 2e-3,
          weight_decay: float = 1e-4, threads: int = 2, log: bool = True) -> dict[str, np.ndarray]:
    """Train the MLP; returns ``{"w1", "b1", "w2", "b2", "w3", "b3"}`` with ``w`` as ``[K, N]``."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed + 12345)
    dims = (FEATURES, *HIDDEN, len(LABELS))
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    net = nn.Sequential(*layers)
    opt = torch.optim.AdamW(net.parameters(), lr=lr / 2, weight_decay=weight_decay)
    steps_per_epoch = (len(xtr) + BATCH - 1) // BATCH
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(1, epochs * steps_per_epoch))
    X, Y = torch.from_numpy(np.ascontiguousarray(xtr, np.float32)), torch.from_numpy(ytr.astype(np.int64))
    t0 = time.monotonic()
    for ep in range(epochs):
        net.train()
        perm = torch.randperm(len(X), generator=gen)
        tot, correct = 0.0, 0
        for i in range(0, len(X), BATCH):
            idx = perm[i : i + BATCH]
            xb = _augment(X[idx], gen)
            out = net(xb)
            loss = nn.functional.cross_entropy(out, Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            tot += float(loss.detach()) * len(idx)
            correct += int((out.detach().argmax(1) == Y[idx]).sum())
        if log:
            print(f"epoch {ep + 1}/{epochs} loss {tot / len(X):.4f} train-acc {correct / len(X):.4f} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)  # fmt: skip
    linears = [m for m in net if isinstance(m, nn.Linear)]
    w: dict[str, np.ndarray] = {}
    for k, lin in enumerate(linears, 1):
        w[f"w{k}"] = np.ascontiguousarray(lin.weight.detach().numpy().T.astype(np.float32))  # [K, N]
        w[f"b{k}"] = lin.bias.detach().numpy().astype(np.float32).copy()
    return w


def build_onnx(w: dict[str, np.ndarray], *, doc: str = ""):
    """MatMul (B = 2-D fp32 initializer [K, N]) + Add (1-D bias) + Relu, opset 17, IR 8."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n_layers = len([k for k in w if k.startswith("w")])
    nodes, inits = [], []
    prev = "x"
    for k in range(1, n_layers + 1):
        wk, bk = np.asarray(w[f"w{k}"], np.float32), np.asarray(w[f"b{k}"], np.float32)
        if wk.ndim != 2 or bk.shape != (wk.shape[1],):
            raise ValueError(f"layer {k}: weight {wk.shape} / bias {bk.shape} do not form [K, N] / [N]")
        inits += [numpy_helper.from_array(wk, f"fc{k}.weight"), numpy_helper.from_array(bk, f"fc{k}.bias")]
        last = k == n_layers
        nodes.append(helper.make_node("MatMul", [prev, f"fc{k}.weight"], [f"fc{k}.matmul"], name=f"fc{k}/MatMul"))
        add_out = "logits" if last else f"fc{k}.add"
        nodes.append(helper.make_node("Add", [f"fc{k}.matmul", f"fc{k}.bias"], [add_out], name=f"fc{k}/Add"))
        if not last:
            nodes.append(helper.make_node("Relu", [add_out], [f"fc{k}.relu"], name=f"fc{k}/Relu"))
            prev = f"fc{k}.relu"
    n_out = int(np.asarray(w[f"w{n_layers}"]).shape[1])
    graph = helper.make_graph(
        nodes,
        "shapes_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", int(np.asarray(w["w1"]).shape[0])])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    if doc:
        model.doc_string = doc
    onnx.checker.check_model(model, full_check=True)
    return model


def evaluate(onnx_bytes: bytes, x: np.ndarray, labels: np.ndarray, *, batch: int = 256) -> tuple[int, float]:
    """(correct, accuracy) of the ONNX model on ``x`` in ONNX Runtime (CPU)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # bit-for-bit the same whatever the core count
    sess = ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
    logits = np.concatenate([sess.run(["logits"], {"x": x[i : i + batch]})[0] for i in range(0, len(x), batch)])
    correct = int((logits.argmax(1) == labels).sum())
    return correct, correct / len(labels)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--train", type=int, default=200_000, help="training images")
    ap.add_argument("--test", type=int, default=5000, help="test images (accuracy figure)")
    ap.add_argument("--seed", type=int, default=0, help="train seed; test uses seed+1, holdout seed+2")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (one-cycle)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.train < 1 or args.test < 1:
        ap.error("--epochs, --train and --test must be positive")

    import onnx
    import torch

    t0 = time.monotonic()
    seeds = {"train": args.seed, "test": args.seed + 1, "holdout": args.seed + 2}
    img, ytr = make_split(seeds["train"], args.train)
    xtr = preprocess(img)
    del img
    xte, yte = (lambda s: (preprocess(s[0]), s[1]))(make_split(seeds["test"], args.test))
    hold_img, yho = make_split(seeds["holdout"], HOLDOUT_N)
    xho = preprocess(hold_img)
    print(f"data: train {xtr.shape} test {xte.shape} holdout {xho.shape} ({time.monotonic() - t0:.0f} s)", flush=True)

    w = train(xtr, ytr, args.epochs, args.seed, lr=args.lr, threads=args.threads)
    model = build_onnx(w, doc=(
        "Shapes MLP (circle/square/triangle/cross). Input: grayscale 32x32 flattened, "
        "/255 - 0.5. Trained by tools/train_mlp.py; see shapes_mlp.json."
    ))  # fmt: skip
    data = model.SerializeToString()
    ok_te, acc_te = evaluate(data, xte, yte)
    ok_ho, acc_ho = evaluate(data, xho, yho)
    print(f"test accuracy {acc_te:.4f} ({ok_te}/{len(yte)}), holdout {acc_ho:.6f} ({ok_ho}/{len(yho)})", flush=True)

    out: Path = args.out
    _write(out / ONNX_NAME, data)
    buf = tempfile.SpooledTemporaryFile()
    np.savez_compressed(buf, x=xho.astype(np.float32), labels=yho.astype(np.int64))
    buf.seek(0)
    _write(out / HOLDOUT_NAME, buf.read())
    params = int(sum(v.size for v in w.values()))
    record = {
        "model": ONNX_NAME,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "producer": PRODUCER,
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "architecture": {
            "layers": [FEATURES, *HIDDEN, len(LABELS)],
            "ops": "MatMul(B = 2-D fp32 initializer [K, N]) + Add(1-D bias) [+ Relu]",
            "parameters": params,
            "input": {"name": "x", "dtype": "float32", "shape": ["batch", FEATURES]},
            "output": {"name": "logits", "dtype": "float32", "shape": ["batch", len(LABELS)]},
        },
        "labels": list(LABELS),
        "preprocess": "tools.train_mlp.preprocess: RGB2GRAY, resize 32x32 INTER_AREA, flatten, /255, -0.5",
        "training": {
            "data": "tools.train_demo.make_split",
            "train": args.train,
            "epochs": args.epochs,
            "seed": args.seed,
            "seeds": seeds,
            "batch": BATCH,
            "optimizer": "AdamW(weight_decay=1e-4), OneCycleLR",
            "lr_peak": args.lr,
            "augment": "8 flips/transposes of the 32x32 grid, polarity inversion",
            "torch": torch.__version__,
            "threads": args.threads,
            "python": platform.python_version(),
            "seconds": round(time.monotonic() - t0, 1),
        },
        "test": {"seed": seeds["test"], "n": int(len(yte)), "correct": ok_te, "accuracy": acc_te},
        "holdout": {
            "file": HOLDOUT_NAME, "seed": seeds["holdout"], "n": int(len(yho)), "correct": ok_ho,
            "accuracy": acc_ho, "evaluated_with": "onnxruntime CPUExecutionProvider, 1 thread",
        },  # fmt: skip
    }
    _write(out / JSON_NAME, (json.dumps(record, indent=1) + "\n").encode())
    assert onnx.load(str(out / ONNX_NAME)).producer_name == PRODUCER
    print(f"wrote {out / ONNX_NAME} ({len(data):,} bytes), {out / JSON_NAME}, {out / HOLDOUT_NAME}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
