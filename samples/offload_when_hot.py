"""A Raspberry Pi that offloads to a Jetson gateway when it heats up, and takes the work back
when it cools.

    # on the gateway (a Jetson):  TOKEN=... edge-sdk serve PACKAGE --host 0.0.0.0 --port 8000 --token-env TOKEN
    # on the Pi:
    TOKEN=... python samples/offload_when_hot.py PACKAGE --gateway http://jetson.local:8000 --token-env TOKEN
    # anywhere, no hardware (what CI runs): a local gateway and a simulated, heating SoC
    python samples/offload_when_hot.py --demo

The Pi side is three pieces of edge_sdk wired together:

- a Router (edge_sdk.remote.router): every request goes to the local model or to the gateway,
  and every result says which and why;
- the gateway as a Model (remote_model over a RemoteClient), allowed to receive the inputs by an
  explicit PrivacyPolicy (the default policy sends nothing off the device);
- a Governor (edge_sdk.budget.governor) reading the SoC temperature through a SensorReader.
  Its action ladder has an Offload step: ``Governor(..., offload=router.set_offload)`` makes that
  step switch the router to the gateway when the device gets hot (CONSTRAINED) and back when it
  has cooled (NORMAL again). ``router.governor = gov`` also offloads while the governor is
  CRITICAL, whatever the ladder did.

--demo starts ``edge-sdk serve`` on 127.0.0.1 (a free port) as the "gateway", and replaces
/sys/class/thermal with a fake tree that edge_sdk.budget.simulator.ThermalSimulator heats: the
real SensorReader and Governor read it. Every exit path stops the server it started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import edge_sdk
from edge_sdk.assets import demo_package_path, demo_samples
from edge_sdk.budget.governor import Budget, Governor
from edge_sdk.budget.sensors import SensorReader
from edge_sdk.budget.simulator import ThermalModel, ThermalSimulator
from edge_sdk.remote import PrivacyPolicy, RemoteClient, RemoteError, Router, RouterOptions, remote_model

DEMO_TOKEN_ENV = "EDGE_SDK_DEMO_GATEWAY_TOKEN"


class SampleError(Exception):
    """Something this sample itself could not do (start the demo gateway, read the token)."""


# -- the demo gateway: `edge-sdk serve` in a subprocess ------------------------------------------


def _die_with_parent_hook():
    """A function for Popen(preexec_fn=) that, on Linux, has the kernel send SIGTERM to the server if
    this process dies without cleaning up (SIGKILL, a crash), so no server is ever left behind.
    Resolved here, in the parent: the child, forked from a process with threads, only makes the call."""
    if not sys.platform.startswith("linux"):
        return None  # elsewhere the finally blocks below still stop it on every normal exit
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def start_gateway(package: Path, workdir: Path, token: str, timeout_s: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Start `edge-sdk serve PACKAGE --port 0` (port 0: the OS picks a free one, the server prints
    the URL) and return (process, url) once it prints it. Output goes to a log file, not a pipe,
    so a chatty server can never block on a full pipe."""
    log_path = workdir / "gateway.log"
    log = open(log_path, "wb")
    cmd = [sys.executable, "-m", "edge_sdk.cli", "serve", str(package), "--host", "127.0.0.1", "--port", "0", "--token-env", DEMO_TOKEN_ENV]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, DEMO_TOKEN_ENV: token}, preexec_fn=_die_with_parent_hook(),
    )  # fmt: skip
    log.close()  # the child has its own copy
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            m = re.search(r"listening on (\S+)", log_path.read_text(errors="replace"))
            if m:
                return proc, m.group(1)
            if proc.poll() is not None:
                raise SampleError(f"edge-sdk serve exited with code {proc.returncode}:\n{log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        raise SampleError(f"edge-sdk serve did not start within {timeout_s:g} s:\n{log_path.read_text(errors='replace')[-2000:]}")
    except BaseException:
        stop_gateway(proc)
        raise


def stop_gateway(proc: subprocess.Popen) -> None:
    """SIGTERM (the server stops its workers and closes its models), then SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    print(f"gateway: edge-sdk serve (pid {proc.pid}) stopped, exit code {proc.returncode}", flush=True)


def wait_ready(client: RemoteClient, url: str, timeout_s: float) -> str | None:
    """Poll /v2/health/ready (bounded): None once the gateway's models are loaded and its workers
    run, else why not."""
    deadline = time.monotonic() + timeout_s
    why = "not ready"
    while time.monotonic() < deadline:
        try:
            if client.ready(deadline_s=1.0):
                return None
            why = "/v2/health/ready answered 503"
        except RemoteError as e:  # refused, timed out, TLS: typed, with the reason
            why = f"{type(e).__name__}: {e}"
        time.sleep(0.1)
    return f"gateway {url} not ready after {timeout_s:g} s ({why})"


def gateway_requests(url: str, token: str | None, model: str) -> int:
    """Successful infer requests the gateway counted for ``model`` (edge_sdk_serve_requests_total, code 200)."""
    import urllib.request

    req = urllib.request.Request(url.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=5) as resp:  # loopback only (the demo gateway)
        text = resp.read().decode()
    m = re.search(
        r'^edge_sdk_serve_requests_total\{[^}]*(?=[^}]*model="%s")(?=[^}]*code="200")[^}]*\} (\S+)$' % re.escape(model), text, re.M
    )
    return int(float(m.group(1))) if m else 0


# -- the loop ---------------------------------------------------------------------------------------


def expected_label(path: Path, labels: tuple[str, ...]) -> str | None:
    """The demo images are named <label>_<n>.png; other images have no known answer."""
    stem = path.stem.rsplit("_", 1)[0]
    return stem if stem in labels else None


def run(args: argparse.Namespace, workdir: Path) -> int:
    package = Path(args.package) if args.package else demo_package_path()
    images = [Path(p) for p in args.images] if args.images else demo_samples()
    for p in images:
        if not p.is_file():
            raise SampleError(f"image {str(p)!r}: expected an image file, it does not exist")

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env, "").strip() or None
        if token is None:
            raise SampleError(f"--token-env {args.token_env}: expected the gateway's token in that environment variable, it is not set")

    # The local model first: a package that cannot load here is the first thing to hear about.
    with edge_sdk.load(package, args.profile) as local:
        profile = local.detection.profile
        gateway = None
        try:
            if args.demo:
                token = secrets.token_hex(16)  # the demo gateway requires a token, like a real one should
                gateway, url = start_gateway(package, workdir, token)
                print(f"gateway: edge-sdk serve (pid {gateway.pid}) listening on {url}", flush=True)
            else:
                url = args.gateway

            # The gateway as a Model: the same manifest validates the inputs and decodes the answers.
            # deadline_s bounds each remote call, retries included; a failing gateway falls back to local.
            with RemoteClient(url, token=token, deadline_s=args.remote_deadline_s) as client:
                not_ready = wait_ready(client, url, 30.0 if args.demo else args.remote_deadline_s)
                if not_ready and args.demo:
                    raise SampleError(not_ready)
                if not_ready:  # a real gateway may come up later: until then offloaded requests fall back to local
                    print(f"warning: {not_ready}; offloaded requests are served locally until it answers", flush=True)
                remote = remote_model(package, client, privacy=PrivacyPolicy("allowed"), profile=args.profile)
                router = Router(local, remote, RouterOptions())

                if args.demo:
                    # A fake /sys/class/thermal/thermal_zone0 that heats with the local work (tau 2 s instead of
                    # a real board's minutes), and a budget scaled to it: idle settles at 40 C, flat out at 95 C.
                    zone = profile.thermal.zones[0] if profile.thermal.zones else "cpu-thermal"
                    sim = ThermalSimulator(workdir, ThermalModel(tau_s=2.0), zone_type=zone)
                    reader = SensorReader(profile, workdir, vcgencmd=False, battery=None)
                    budget = Budget(soft_c=args.soft_c, hard_c=args.hard_c, hysteresis_c=3.0, min_dwell_s=1.0, sample_interval_s=0.1)
                else:
                    sim = None
                    reader = SensorReader(profile)  # the real /sys, vcgencmd on a Pi
                    budget = Budget.from_profile(profile)  # soft = thermal.warn_c, hard = thermal.critical_c
                print(
                    f"device: profile {profile.name}, local variant {local.variant.id}; "
                    f"budget soft {budget.soft_c:g} C, hard {budget.hard_c:g} C",
                    flush=True,
                )

                # The connection: the ladder's Offload step calls router.set_offload(True / False).
                gov = Governor(reader.read, budget, offload=router.set_offload)
                router.governor = gov  # CRITICAL offloads too, even if the ladder's step was vetoed
                events: queue.SimpleQueue = queue.SimpleQueue()
                gov.subscribe(events.put)  # called on the governor's thread: hand over, print from here
                rc = loop(args, router, gov, sim, images, local.manifest.labels, events)
                remote.close()
            if args.demo:  # the gateway's own count, from its Prometheus /metrics: what the router sent did arrive
                print(f"gateway: answered {gateway_requests(url, token, local.manifest.name)} inference requests (its /metrics)")
            return rc
        finally:
            if gateway is not None:
                stop_gateway(gateway)


def loop(
    args: argparse.Namespace, router: Router, gov: Governor, sim: ThermalSimulator | None, images: list[Path],
    labels: tuple[str, ...], events: queue.SimpleQueue,
) -> int:  # fmt: skip
    """Classify the images at --rate until --requests or --duration, printing where each was served and why."""
    served: Counter = Counter()
    transitions: list[str] = []
    wrong = 0
    period = 1.0 / args.rate
    busy_s = args.demo_busy_ms / 1e3
    # the simulator's thread advances the fake SoC; the governor's thread samples the sensors
    with sim if sim is not None else contextlib.nullcontext(), gov:
        t_end = time.monotonic() + args.duration
        next_t = time.monotonic()
        for i in range(args.requests):
            if time.monotonic() >= t_end:
                break
            print_events(events, transitions)
            path = images[i % len(images)]
            r = router.predict_image(path)
            if sim is not None and r.served_by == "local":
                # The demo model takes well under a millisecond here; a Pi app (camera, preprocessing, a
                # real-size model) keeps its CPU busy for tens of ms per frame. Each locally served
                # request reports that much work to the simulated SoC; offloaded ones cost it nothing.
                sim.add_work(max(busy_s, r.result.timings.total_ms / 1e3))
            want = expected_label(path, labels)
            ok = "" if want is None else (" ok" if r.top1.label == want else f" WRONG (expected {want})")
            wrong += ok.startswith(" WRONG")
            served[r.served_by] += 1
            snap = gov.last_snapshot
            temp = f"{snap.temp_c:.1f} C" if snap is not None and snap.temp_c is not None else "temp unknown"
            print(
                f"#{i:04d} {path.name}: {r.top1.label} {r.top1.score:.2f}{ok} | served {r.served_by} ({r.reason}) | "
                f"{gov.state.value} {temp}",
                flush=True,
            )
            next_t += period
            time.sleep(max(0.0, next_t - time.monotonic()))
        gov.restore("sample finished")  # give back every step still in effect (offload off)
    print_events(events, transitions)
    print(f"summary: {sum(served.values())} requests, local {served['local']}, remote {served['remote']}, wrong {wrong}")
    for (where, trigger), n in sorted(router.requests_by_trigger.items()):
        print(f"summary: served {where} by {trigger}: {n}")
    print(f"summary: {len(transitions)} governor transitions" + "".join(f"\n  {t}" for t in transitions))
    if sim is not None:
        print(f"summary: simulated SoC max {sim.max_c:.1f} C, {sim.time_above(args.soft_c):.1f} s above the soft limit")
    return 0 if wrong == 0 else 4


def print_events(events: queue.SimpleQueue, transitions: list[str]) -> None:
    """Print the governor's events in order with the requests (they arrive on its thread)."""
    while not events.empty():
        e = events.get()
        if e.kind == "transition":
            transitions.append(f"{e.detail} ({e.reason})")
            print(f"governor: {e.detail} ({e.reason})", flush=True)
        elif e.kind != "skipped":  # this sample has no pipeline to slow down: lower_rate etc. are skipped
            print(f"governor: {e.action} {e.kind}: {e.detail} ({e.reason})", flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Classify images on this device, offloading to a gateway running `edge-sdk serve` while the device is hot.",
        epilog="Exit codes: 0 done, 1 error (message on stderr), 2 bad arguments, 4 a demo image was misclassified.",
    )
    ap.add_argument("package", nargs="?", help="model package (default: the bundled demo); the gateway must serve the same model")
    ap.add_argument("--gateway", help="gateway URL, e.g. http://jetson.local:8000 (https on a network you do not trust)")
    ap.add_argument("--token-env", help="environment variable holding the gateway's bearer token")
    ap.add_argument("--demo", action="store_true", help="no hardware: start a local gateway and heat a simulated SoC")
    ap.add_argument("--images", nargs="+", help="images to classify in a loop (default: the demo's sample images)")
    ap.add_argument("--profile", help="device profile (default: $EDGE_SDK_PROFILE or detected)")
    ap.add_argument("--requests", type=int, default=400, help="at most this many requests (default 400)")
    ap.add_argument("--duration", type=float, default=12.0, help="at most this many seconds (default 12)")
    ap.add_argument("--rate", type=float, default=40.0, help="requests per second (default 40)")
    ap.add_argument("--remote-deadline-s", type=float, default=2.0, help="the most one remote call may take (default 2)")
    ap.add_argument("--demo-busy-ms", type=float, default=22.0, help="--demo: CPU work each local request stands for (default 22)")
    ap.add_argument("--soft-c", type=float, default=50.0, help="--demo: soft limit, C (default 50)")
    ap.add_argument("--hard-c", type=float, default=80.0, help="--demo: hard limit, C (default 80)")
    args = ap.parse_args(argv)
    if args.demo == bool(args.gateway):
        ap.error("give exactly one of --gateway URL (real hardware) or --demo")
    if args.requests < 1 or args.duration <= 0 or args.rate <= 0:
        ap.error("--requests, --duration and --rate: expected positive numbers")

    # SIGTERM (systemd, docker stop, a CI timeout) ends the sample like Ctrl-C: through every finally.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with tempfile.TemporaryDirectory(prefix="offload-demo-") as tmp:
            return run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (edge_sdk.EdgeSDKError, SampleError, ValueError) as e:  # typed SDK errors say what was expected
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
