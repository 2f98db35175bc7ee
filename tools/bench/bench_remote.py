"""Remote fallback benchmark: offload under 2x offered load, and JSON vs binary on the wire.

    python tools/bench/bench_remote.py [--seconds 10] [--json OUT]

A. Encoding. One 224x224x3 uint8 frame and one 1x3x224x224 float32 tensor: request encode (client)
   and decode (server) time and size with JSON tensors vs the binary extension
   (edge_sdk.remote.protocol), and the round trip over loopback to ``edge-sdk serve`` serving an
   Identity model (so the time is the wire, not a model).

B. Offload under load. A MobileNetV2-class classifier (random weights, fp32 ONNX, 1 thread).
   The remote is ``edge-sdk serve`` in its own process on 127.0.0.1 (1 thread, dynamic batching
   up to 4): a LAN gateway. Both sides share this machine's cores, so the edge device is emulated
   as 3x slower than the gateway: each local call is the real inference plus a fixed sleep of twice
   its idle inference time (a Pi-class CPU against a Jetson-class gateway; the sleep uses no CPU,
   so the gateway's core stays free). Local capacity C = 1 / local service time. Requests arrive open-loop
   (Poisson) at 2C for ``--seconds``; latency is from each request's arrival to its answer, so a
   request that waits for a free thread is not hidden (no coordinated omission).

   - local only, bounded queue: at most ``Q`` requests wait; others are rejected at once;
   - router: local first, offload when the queue is full or the latency objective is at risk
     (``RouterOptions(max_local_queue=Q, latency_objective_ms=objective)``), remote over binary.

   Reported: throughput, rejected, p50/p99/max latency, and where requests were served.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_remote.py)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SLOWDOWN = 3.0  # the emulated edge device is this many times slower than the gateway
QUEUE = 2


def _pct(v: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(v), q)) if v else float("nan")


def write_packages(work: Path) -> dict[str, Path]:
    import onnx
    from onnx import TensorProto, helper

    from converters.packaging import write_package
    from tools.fixtures.mobilenetv2 import build_mobilenetv2

    out = {}
    raw = {"task": "raw"}
    mnv2 = build_mobilenetv2(1.0, 224, batch="batch").SerializeToString()
    write_package(
        work / "mnv2",
        {
            "name": "mobilenetv2", "version": "1", **raw,
            "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 224, 224], "layout": "NCHW", "dims": {"batch": [1, 4]}}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 1000]}],
            "variants": [{"id": "fp32-onnx", "file": "model.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },
        files={"model.onnx": mnv2},
    )  # fmt: skip
    out["mnv2"] = work / "mnv2"
    g = helper.make_graph(
        [helper.make_node("Identity", ["frame"], ["same"])],
        "identity",
        [helper.make_tensor_value_info("frame", TensorProto.UINT8, [1, 224, 224, 3])],
        [helper.make_tensor_value_info("same", TensorProto.UINT8, [1, 224, 224, 3])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    write_package(
        work / "identity",
        {
            "name": "identity", "version": "1", **raw,
            "inputs": [{"name": "frame", "dtype": "uint8", "shape": [1, 224, 224, 3], "layout": "NHWC"}],
            "outputs": [{"name": "same", "dtype": "uint8", "shape": [1, 224, 224, 3]}],
            "variants": [{"id": "fp32-onnx", "file": "model.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },
        files={"model.onnx": m.SerializeToString()},
    )  # fmt: skip
    out["identity"] = work / "identity"
    assert onnx  # noqa: S101 - imported for the helper API
    return out


class ServeProcess:
    """``edge-sdk serve`` in its own process on a free 127.0.0.1 port."""

    def __init__(self, packages: list[Path], *args: str) -> None:
        cmd = [sys.executable, "-m", "edge_sdk.cli", "serve", *map(str, packages), "--port", "0", "--profile", "generic-x86_64", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(ROOT))
        deadline = time.monotonic() + 60
        self.url = ""
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            self.close()
            raise RuntimeError("edge-sdk serve did not start within 60 s")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def section_a(pk: dict[str, Path]) -> dict[str, Any]:
    import edge_sdk
    from edge_sdk.remote.client import RemoteClient
    from edge_sdk.remote.privacy import PrivacyPolicy
    from edge_sdk.remote.protocol import decode_request, encode_request
    from edge_sdk.remote.session import remote_model

    rng = np.random.default_rng(0)
    tensors = {
        "uint8 224x224x3 frame": rng.integers(0, 256, (1, 224, 224, 3), dtype=np.uint8),
        "float32 1x3x224x224 tensor": rng.standard_normal((1, 3, 224, 224)).astype(np.float32),
    }
    rows = []
    for name, arr in tensors.items():
        for binary in (False, True):
            te, td = [], []
            for _ in range(21):
                t = time.perf_counter()
                body, headers = encode_request({"x": arr}, binary_inputs=binary)
                te.append(time.perf_counter() - t)
                t = time.perf_counter()
                decode_request(body, headers)
                td.append(time.perf_counter() - t)
            rows.append({"tensor": name, "wire": "binary" if binary else "json", "bytes": len(body),
                         "encode_ms": statistics.median(te) * 1e3, "decode_ms": statistics.median(td) * 1e3})  # fmt: skip
    srv = ServeProcess([pk["identity"]])
    trips = []
    try:
        frame = tensors["uint8 224x224x3 frame"]
        for wire in ("json", "binary"):
            m = remote_model(pk["identity"], RemoteClient(srv.url, wire=wire), privacy=PrivacyPolicy("allowed"), profile="generic-x86_64")
            for _ in range(3):
                r = m.predict(frame)
            assert np.array_equal(r.outputs["same"], frame)  # noqa: S101 - the wire carried the frame intact
            ts = []
            for _ in range(30):
                t = time.perf_counter()
                m.predict(frame)
                ts.append((time.perf_counter() - t) * 1e3)
            trips.append({"wire": wire, "p50_ms": _pct(ts, 50), "p99_ms": _pct(ts, 99)})
            m.close()
    finally:
        srv.close()
    assert edge_sdk  # noqa: S101
    return {"encoding": rows, "round_trip": trips}


class SlowEdge:
    """The real local model, emulating an edge CPU ``SLOWDOWN`` x slower: each call sleeps a fixed
    (SLOWDOWN - 1) x the model's idle inference time after it (no CPU used while asleep; fixed, so
    that contention on this shared machine is not multiplied by the emulation)."""

    def __init__(self, model: Any, x: np.ndarray) -> None:
        self.model = model
        ts = []
        for i in range(25):
            t = time.perf_counter()
            model.predict(x)
            if i >= 5:
                ts.append(time.perf_counter() - t)
        self.extra_s = statistics.median(ts) * (SLOWDOWN - 1)

    def predict(self, x: Any, **kw: Any) -> Any:
        r = self.model.predict(x, **kw)
        time.sleep(self.extra_s)
        return r


class LocalOnly:
    """Local only with a bounded queue: at most ``q`` requests wait; the rest are rejected."""

    def __init__(self, model: Any, q: int) -> None:
        self.model, self.q = model, q
        self._lock = threading.Condition()
        self._busy = False
        self._waiting = 0

    def predict(self, x: Any) -> Any:
        with self._lock:
            if self._busy and self._waiting >= self.q:
                return None
            self._waiting += 1
            while self._busy:
                self._lock.wait()
            self._waiting -= 1
            self._busy = True
        try:
            return self.model.predict(x)
        finally:
            with self._lock:
                self._busy = False
                self._lock.notify()


def offered_load(fn: Any, rate: float, seconds: float, x: np.ndarray, seed: int = 1) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2) + 10))
    arrivals = arrivals[arrivals < seconds]
    lat: list[float] = []
    by_side: dict[str, list[float]] = {}
    where: dict[str, int] = {}
    rejected = 0
    errors = 0
    lock = threading.Lock()
    t0 = time.perf_counter()

    def one(at: float) -> None:
        nonlocal rejected, errors
        try:
            r = fn(x)
        except Exception:
            with lock:
                errors += 1
            return
        done = time.perf_counter() - t0
        with lock:
            if r is None:
                rejected += 1
                return
            lat.append((done - at) * 1e3)
            w = getattr(r, "served_by", "local")
            where[w] = where.get(w, 0) + 1
            by_side.setdefault(w, []).append((done - at) * 1e3)

    with ThreadPoolExecutor(max_workers=64) as pool:
        for at in arrivals:
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, float(at))
    wall = time.perf_counter() - t0
    return {
        "offered": len(arrivals), "served": len(lat), "rejected": rejected, "errors": errors, "wall_s": wall,
        "throughput_rps": len(lat) / wall, "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "max_ms": max(lat) if lat else float("nan"),
        "served_by": where,
        "p99_by_side_ms": {k: _pct(v, 99) for k, v in by_side.items()},
        "p50_by_side_ms": {k: _pct(v, 50) for k, v in by_side.items()},
    }  # fmt: skip


def section_b(pk: dict[str, Path], seconds: float, work: Path) -> dict[str, Any]:
    import edge_sdk
    from edge_sdk.remote.client import RemoteClient
    from edge_sdk.remote.privacy import PrivacyPolicy
    from edge_sdk.remote.router import Router, RouterOptions
    from edge_sdk.remote.session import remote_model

    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with edge_sdk.load(pk["mnv2"], "generic-x86_64", threads=1, cache_dir=work / "cache") as model:
        edge = SlowEdge(model, x)
        ts = []
        for _ in range(20):
            t = time.perf_counter()
            edge.predict(x)
            ts.append(time.perf_counter() - t)
        svc_ms = statistics.median(ts) * 1e3
        capacity = 1e3 / svc_ms
        rate = 2 * capacity
        objective_ms = (QUEUE + 1) * svc_ms * 1.5
        srv = ServeProcess([pk["mnv2"]], "--threads", "1", "--max-batch", "4", "--max-delay-ms", "2")
        try:
            remote = remote_model(pk["mnv2"], RemoteClient(srv.url, wire="binary", deadline_s=5.0), privacy=PrivacyPolicy("allowed"),
                                  profile="generic-x86_64")  # fmt: skip
            for _ in range(5):
                remote.predict(x)
            tr = []
            for _ in range(20):
                t = time.perf_counter()
                remote.predict(x)
                tr.append(time.perf_counter() - t)
            local_only = offered_load(LocalOnly(edge, QUEUE).predict, rate, seconds, x)
            router = Router(edge, remote, RouterOptions(max_local_queue=QUEUE, latency_objective_ms=objective_ms))
            routed = offered_load(router.predict, rate, seconds, x)
            remote.close()
        finally:
            srv.close()
    return {
        "local_service_ms": svc_ms, "local_capacity_rps": capacity, "offered_rps": rate, "objective_ms": objective_ms,
        "remote_service_ms": statistics.median(tr) * 1e3, "queue": QUEUE, "slowdown": SLOWDOWN,
        "local_only": local_only, "router": routed,
    }  # fmt: skip


def render(r: dict[str, Any]) -> str:
    a, b = r["A"], r["B"]
    L = [f"# Remote fallback ({r['machine']})", "", "## A. JSON vs binary for one frame", ""]
    L += ["| tensor | wire | bytes | encode ms | decode ms |", "|---|---|---:|---:|---:|"]
    for x in a["encoding"]:
        L.append(f"| {x['tensor']} | {x['wire']} | {x['bytes']:,} | {x['encode_ms']:.2f} | {x['decode_ms']:.2f} |")
    L += ["", "Round trip over loopback to `edge-sdk serve` (Identity model on the uint8 frame; client encode, HTTP, server decode, "
          "run, encode, client decode):", "", "| wire | p50 ms | p99 ms |", "|---|---:|---:|"]  # fmt: skip
    for x in a["round_trip"]:
        L.append(f"| {x['wire']} | {x['p50_ms']:.2f} | {x['p99_ms']:.2f} |")
    L += [
        "",
        "## B. Offload under 2x offered load",
        "",
        f"Local (emulated edge, {b['slowdown']:g}x slower than the gateway): {b['local_service_ms']:.1f} ms per request, capacity "
        f"{b['local_capacity_rps']:.0f} req/s. Remote (edge-sdk serve, own process, 1 thread): {b['remote_service_ms']:.1f} ms per "
        f"request from the client. Offered: {b['offered_rps']:.0f} req/s (Poisson) for {r['seconds']:g} s. Local queue bound "
        f"{b['queue']}; latency objective {b['objective_ms']:.0f} ms.",
        "",
        "| arm | offered | served | rejected | errors | throughput req/s | p50 ms | p99 ms | max ms | served by | p50 / p99 by side |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, x in (("local only (bounded queue)", b["local_only"]), ("router (local first, offload)", b["router"])):
        L.append(
            f"| {name} | {x['offered']} | {x['served']} | {x['rejected']} | {x['errors']} | {x['throughput_rps']:.0f} | {x['p50_ms']:.1f} | "
            f"{x['p99_ms']:.1f} | {x['max_ms']:.1f} | {x['served_by']} | "
            + ", ".join(f"{k} {x['p50_by_side_ms'][k]:.0f} / {x['p99_by_side_ms'][k]:.0f}" for k in x["p99_by_side_ms"]) + " |"
        )
    ok = b["router"]["p99_ms"] <= b["objective_ms"]
    L += ["", f"Router p99 {b['router']['p99_ms']:.1f} ms vs objective {b['objective_ms']:.0f} ms: {'met' if ok else '**missed**'}."]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="offered load duration per arm (default 10)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    machine = machine_record()
    with tempfile.TemporaryDirectory(prefix="edge-bench-remote-") as tmp:
        work = Path(tmp)
        pk = write_packages(work)
        res = {
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "seconds": args.seconds,
            "A": section_a(pk),
            "B": section_b(pk, args.seconds, work),
        }
    res["machine_record"] = finish_record(machine)
    sys.stdout.write(render(res))
    print(f"CPU: {machine_line(machine)}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
