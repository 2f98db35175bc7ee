"""Train the demo model that ships with edge_sdk, and write its package.

The data is made here: coloured circles, squares, triangles and crosses drawn
with OpenCV at random size, position, rotation, colour and background, with
noise. A small CNN (3 conv layers, ~24k parameters) is trained with PyTorch on
the CPU, its weights are written as an ONNX graph (fp32), quantized with ONNX
Runtime's static QDQ quantizer (int8), and written as TFLite (fp32, NHWC) with
converters.tflite_writer. Every variant is measured against the fp32 ONNX
reference on a held-out test split (cosine of logits, top-1 agreement,
accuracy), and the package manifest records the figures.

Reproduce (about five minutes on two cores; the committed outputs came from the defaults):

    pip install torch==2.13.0 onnx ai-edge-litert opencv-python-headless
    python tools/train_demo.py            # writes edge_sdk/assets/

Outputs (committed): edge_sdk/assets/shapes-classifier/{edge-model.toml,
model_fp32.onnx, model_int8.onnx, model_fp32.tflite} and
edge_sdk/assets/samples/*.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LABELS = ("circle", "square", "triangle", "cross")
SRC = 64  # drawn image side, pixels
HW = 32  # model input side
MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def draw(rng: np.random.Generator, label: int, side: int = SRC) -> np.ndarray:
    """One RGB uint8 image of shape (side, side, 3) with the given shape class."""
    bg = rng.integers(0, 256, 3)
    img = np.empty((side, side, 3), np.uint8)
    img[:] = bg
    # a gradient and noise so the background is never flat
    g = np.linspace(-1, 1, side, dtype=np.float32)[None, :, None] * rng.uniform(-30, 30)
    img = np.clip(img.astype(np.float32) + g + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)
    while True:
        fg = rng.integers(0, 256, 3)
        if np.abs(fg.astype(int) - bg.astype(int)).sum() > 150:
            break
    color = tuple(int(c) for c in fg)
    r = rng.uniform(0.18, 0.4) * side
    cx, cy = rng.uniform(r + 2, side - r - 2, 2)
    ang = rng.uniform(0, 2 * np.pi)
    filled = rng.random() < 0.7
    th = -1 if filled else int(rng.integers(2, 4))
    if label == 0:
        cv2.circle(img, (int(cx), int(cy)), int(r), color, th, cv2.LINE_AA)
    else:
        if label == 1:
            k = 4
            pts = [(cx + r * np.cos(ang + i * np.pi / 2), cy + r * np.sin(ang + i * np.pi / 2)) for i in range(k)]
        elif label == 2:
            pts = [(cx + r * np.cos(ang + i * 2 * np.pi / 3), cy + r * np.sin(ang + i * 2 * np.pi / 3)) for i in range(3)]
        else:
            w = r * 0.35
            base = [(-w, -r), (w, -r), (w, -w), (r, -w), (r, w), (w, w), (w, r), (-w, r), (-w, w), (-r, w), (-r, -w), (-w, -w)]
            c, s = np.cos(ang), np.sin(ang)
            pts = [(cx + x * c - y * s, cy + x * s + y * c) for x, y in base]
        poly = np.array(pts, np.float32).round().astype(np.int32)
        if filled:
            cv2.fillPoly(img, [poly], color, cv2.LINE_AA)
        else:
            cv2.polylines(img, [poly], True, color, th, cv2.LINE_AA)
    return img


def make_split(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(LABELS), n)
    x = np.stack([draw(rng, int(c)) for c in y])
    return x, y


def to_tensor(images: np.ndarray) -> np.ndarray:
    """Same preprocessing as the manifest declares (stretch resize, RGB, mean/std, NCHW)."""
    out = np.stack([cv2.resize(im, (HW, HW), interpolation=cv2.INTER_AREA) for im in images]).astype(np.float32) / 255.0
    out = (out - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def train(xtr: np.ndarray, ytr: np.ndarray, epochs: int, seed: int) -> dict[str, np.ndarray]:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    torch.set_num_threads(2)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, len(LABELS)),
    )  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    X, Y = torch.from_numpy(xtr), torch.from_numpy(ytr).long()
    for ep in range(epochs):
        perm = torch.randperm(len(X))
        net.train()
        tot = 0.0
        for i in range(0, len(X), 128):
            idx = perm[i : i + 128]
            xb = X[idx]
            if torch.rand(()) < 0.5:
                xb = xb.flip(3)
            loss = nn.functional.cross_entropy(net(xb), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(idx)
        sched.step()
        print(f"epoch {ep + 1}/{epochs} loss {tot / len(X):.4f}")
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in net.state_dict().items()}
    return {
        "c1w": sd["0.weight"], "c1b": sd["0.bias"], "c2w": sd["3.weight"], "c2b": sd["3.bias"],
        "c3w": sd["6.weight"], "c3b": sd["6.bias"], "fcw": sd["10.weight"], "fcb": sd["10.bias"],
    }  # fmt: skip


def onnx_model(w: dict[str, np.ndarray], max_batch: int):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    n = []
    prev = "image"
    for i in (1, 2, 3):
        n.append(helper.make_node("Conv", [prev, f"c{i}w", f"c{i}b"], [f"conv{i}"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]))
        n.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]))
        prev = f"relu{i}"
        if i < 3:
            n.append(helper.make_node("MaxPool", [prev], [f"pool{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            prev = f"pool{i}"
    n.append(helper.make_node("GlobalAveragePool", [prev], ["gap"]))
    n.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    n.append(helper.make_node("Gemm", ["flat", "fcw", "fcb"], ["logits"], transB=1))
    g = helper.make_graph(
        n,
        "shapes_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, HW, HW])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="edge_sdk tools/train_demo.py")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def tflite_model(w: dict[str, np.ndarray], max_batch: int) -> bytes:
    from converters.tflite_writer import TFLiteBuilder

    b = TFLiteBuilder(description="edge_sdk shapes-classifier (tools/train_demo.py)")
    x = b.input("image", shape=(1, HW, HW, 3), dtype="float32", shape_signature=(-1, HW, HW, 3))
    for i in (1, 2, 3):
        x = b.conv2d(x, w[f"c{i}w"].transpose(0, 2, 3, 1).copy(), w[f"c{i}b"], stride=(1, 1), padding="SAME", activation="RELU")
        if i < 3:
            x = b.max_pool2d(x, size=(2, 2), stride=(2, 2), padding="VALID")
    x = b.mean(x, axes=(1, 2), keepdims=False)
    x = b.fully_connected(x, w["fcw"], w["fcb"], activation="NONE")
    b.output(x, "logits")
    return b.build()


def quantize_int8(fp32_path: Path, out_path: Path, calib: np.ndarray) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calib[i : i + 1] for i in range(len(calib)))

        def get_next(self):  # type: ignore[override]
            x = next(self.it, None)
            return None if x is None else {"image": x}

    quantize_static(
        str(fp32_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip


def measure(run, xte: np.ndarray, yte: np.ndarray, ref_logits: np.ndarray | None) -> tuple[np.ndarray, dict]:
    logits = np.concatenate([run(xte[i : i + 16]) for i in range(0, len(xte), 16)])
    acc = float((logits.argmax(1) == yte).mean())
    q: dict[str, object] = {"metric": "accuracy", "value": round(acc, 4), "samples": int(len(xte))}
    if ref_logits is not None:
        a, b = logits.ravel().astype(np.float64), ref_logits.ravel().astype(np.float64)
        q["cosine"] = round(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))), 6)
        q["top1_agreement"] = round(float((logits.argmax(1) == ref_logits.argmax(1)).mean()), 4)
    return logits, q


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "edge_sdk" / "assets")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--train", type=int, default=30000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", type=Path, help="reuse/keep trained weights in this .npz (skips training when it exists)")
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter

    from edge_sdk.package import Manifest, file_ref

    max_batch = 16
    xtr_img, ytr = make_split(args.seed, args.train)
    xte_img, yte = make_split(args.seed + 1, args.test)
    xtr, xte = to_tensor(xtr_img), to_tensor(xte_img)
    if args.weights and args.weights.exists():
        w = dict(np.load(args.weights))
    else:
        w = train(xtr, ytr, args.epochs, args.seed)
        if args.weights:
            np.savez(args.weights, **w)

    pkg = args.out / "shapes-classifier"
    tmp = Path(tempfile.mkdtemp())
    onnx.save(onnx_model(w, max_batch), tmp / "model_fp32.onnx")
    quantize_int8(tmp / "model_fp32.onnx", tmp / "model_int8.onnx", xtr[:256])
    (tmp / "model_fp32.tflite").write_bytes(tflite_model(w, max_batch))

    def ort_run(path: Path):
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda x: s.run(None, {"image": x})[0]

    def tfl_run(path: Path):
        it = Interpreter(model_path=str(path), num_threads=2)

        def run(x: np.ndarray) -> np.ndarray:
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
            i = it.get_input_details()[0]
            if tuple(i["shape"]) != x.shape:
                it.resize_tensor_input(i["index"], list(x.shape), strict=True)
                it.allocate_tensors()
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
            return it.get_tensor(it.get_output_details()[0]["index"])

        it.allocate_tensors()
        return run

    dataset = f"shapes-v1 test split (tools/train_demo.py seed {args.seed + 1}, {args.test} images)"
    ref, q32 = measure(ort_run(tmp / "model_fp32.onnx"), xte, yte, None)
    _, q8 = measure(ort_run(tmp / "model_int8.onnx"), xte, yte, ref)
    _, qtf = measure(tfl_run(tmp / "model_fp32.tflite"), xte, yte, ref)
    print("fp32 onnx", q32, "\nint8 onnx", q8, "\nfp32 tflite", qtf)

    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    for f in ("model_fp32.onnx", "model_int8.onnx", "model_fp32.tflite"):
        shutil.copy(tmp / f, pkg / f)

    img_in = {
        "name": "image", "dtype": "float32", "shape": ["batch", 3, HW, HW], "layout": "NCHW",
        "dims": {"batch": [1, max_batch]},
        "preprocess": {"kind": "image", "size_hw": [HW, HW], "resize": "stretch", "color": "RGB",
                       "scale": 1 / 255, "mean": list(MEAN), "std": list(STD), "interpolation": "area"},
    }  # fmt: skip
    nhwc_in = dict(img_in, shape=["batch", HW, HW, 3], layout="NHWC")

    def variant(vid: str, f: str, backend: str, precision: str, quality: dict, **extra: object) -> dict:
        ref_ = file_ref(pkg, f)
        d = {"id": vid, "file": f, "backend": backend, "precision": precision, "sha256": ref_.sha256, "size": ref_.size}
        d.update(extra)
        d["quality"] = dict(quality, dataset=dataset, **({"reference": "fp32-onnx"} if "cosine" in quality else {}))
        return d

    manifest = Manifest.from_dict(
        {
            "schema": 1,
            "name": "shapes-classifier",
            "version": "1.0.0",
            "task": "classification",
            "description": "Classifies a drawn shape (circle, square, triangle, cross). Trained by tools/train_demo.py on data it draws.",
            "labels": list(LABELS),
            "decoder": {"kind": "classification", "output": "logits", "softmax": True, "top_k": 3},
            "inputs": [img_in],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", len(LABELS)]}],
            "variants": [
                variant("fp32-onnx", "model_fp32.onnx", "onnxruntime", "fp32", q32, reference=True),
                variant("int8-onnx", "model_int8.onnx", "onnxruntime", "int8", q8),
                variant("fp32-tflite", "model_fp32.tflite", "litert", "fp32", qtf, inputs=[nhwc_in]),
            ],
        }
    )
    (pkg / "edge-model.toml").write_text(
        "# Written by tools/train_demo.py; do not edit by hand (digests cover every model file).\n" + manifest.to_toml()
    )

    samples = args.out / "samples"
    if samples.exists():
        shutil.rmtree(samples)
    samples.mkdir()
    rng = np.random.default_rng(args.seed + 7)
    for li, name in enumerate(LABELS):
        for k in range(3):
            cv2.imwrite(str(samples / f"{name}_{k + 1}.png"), draw(rng, li)[:, :, ::-1])
    (args.out / "training.json").write_text(
        json.dumps({"epochs": args.epochs, "train": args.train, "test": args.test, "seed": args.seed,
                    "quality": {"fp32-onnx": q32, "int8-onnx": q8, "fp32-tflite": qtf}}, indent=1) + "\n"
    )  # fmt: skip
    shutil.rmtree(tmp)
    print(f"wrote {pkg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
