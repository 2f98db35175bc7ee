"""The ``edge-sdk monitor`` subcommand: a live view of the device's budget (``edge_sdk/cli.py`` stays thin).

    edge-sdk monitor [--profile P] [--root DIR] [--interval S] [--count N] [--url URL] [--json]

:func:`add_arguments` adds the monitor's own options (the CLI adds ``--profile``, ``--root`` and
``--json``), :func:`run` runs it for parsed arguments and the resolved profile, and :func:`watch`
is the loop itself, with keyword arguments. Two sources:

- local (default): read this device's sensors (:class:`~edge_sdk.budget.sensors.SensorReader`,
  from ``--root``) every ``--interval`` seconds and run an observing
  :class:`~edge_sdk.budget.governor.Governor` (no actions: it shows the state an app's governor
  would be in, and every transition with its reason);
- ``--url``: scrape a running app's Prometheus endpoint (:class:`edge_sdk.telemetry.MetricsServer`)
  and show its governor: state, temperatures, power rails, the ladder steps it has in effect and
  its event counts.

Text goes to the terminal (redrawn in place on a tty); ``--json`` prints one JSON object per
sample, for machines. ``--count N`` stops after N samples (0: until Ctrl-C).

Exit status 0 (Ctrl-C too, in the CLI); a bad ``--interval`` or ``--count`` raises ``ValueError``,
which the CLI prints as one line with status 1. Nothing above :mod:`edge_sdk.budget` is imported
but :mod:`edge_sdk.telemetry` (``parse``, for ``--url``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any, Callable, TextIO

from ..errors import OptionsError

__all__ = ["add_arguments", "render_local", "render_scrape", "run", "watch"]

_CLEAR = "\x1b[H\x1b[2J"
_FLAG_NAMES = (
    ("under_voltage", "under-voltage"),
    ("freq_capped", "frequency capped"),
    ("throttled", "throttled"),
    ("soft_temp_limit", "soft temperature limit"),
)


def _f(v: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "?" if v is None or v != v else f"{v:{fmt}}{unit}"  # None or NaN: unknown


def render_local(profile_name: str, sample: int, snap: Any, gov: Any, new_events: list[Any]) -> str:
    """One screen of the local view."""
    t = gov.telemetry(last_events=0)
    b = gov.budget
    now = datetime.now().strftime("%H:%M:%S")
    lines = [f"edge-sdk monitor  {profile_name}  {now}  sample {sample}"]
    budget = f"soft {b.soft_c:g} C, hard {b.hard_c:g} C, hysteresis {b.hysteresis_c:g} C"
    if b.power_budget_w:
        budget += f", power budget {b.power_budget_w:g} W over {b.power_window_s:g} s"
    lines.append(f"governor: {t['state'].upper()} for {t['state_for_s']:.1f} s ({budget})")
    lines.append("  actions in effect: " + (", ".join(t["applied"]) or "none (monitor observes; an app's governor acts)"))
    lines.append(f"temperatures (watched: {_f(snap.temp_c, '.1f', ' C')}):")
    for r in snap.temps:
        trips = ", ".join(f"{k} {v:g}" for k, v in sorted(r.trips_c.items(), key=lambda kv: kv[1]))
        lines.append(f"  {r.name[:28]:28s} {_f(r.temp_c, '6.1f', ' C'):>9s}  {r.source}" + (f"  [{trips}]" if trips else ""))
    if not snap.temps:
        lines.append("  none readable")
    thr = snap.throttled
    if thr is not None:
        now_f = [label for key, label in _FLAG_NAMES if getattr(thr, key + "_now")]
        boot_f = [label for key, label in _FLAG_NAMES if getattr(thr, key + "_since_boot")]
        lines.append(f"throttled: {thr.raw:#x}  now: {', '.join(now_f) or 'none'}; since boot: {', '.join(boot_f) or 'none'}")
    src = f" ({snap.board_power_source})" if snap.board_power_source else ""
    lines.append(f"power: board {_f(snap.board_power_w, '.2f', ' W')}{src}, window mean {_f(t['power_mean_w'], '.2f', ' W')}")
    for r in snap.rails:
        lines.append(f"  {r.name[:20]:20s} {_f(r.power_w, '7.3f', ' W'):>9s} {_f(r.voltage_v, '6.3f', ' V'):>8s} {_f(r.current_a, '6.3f', ' A'):>8s}  {r.source}")
    bat = snap.battery
    bat_s = "none" if bat is None else f"{_f(bat.percent, '.0f', ' %')}" + ("" if bat.plugged is None else (" plugged" if bat.plugged else " on battery"))
    lines.append(f"battery: {bat_s}   cpu: {_f(snap.cpu_freq_mhz, '.0f', ' MHz')}, {_f(snap.cpu_util_pct, '.0f', ' %')} busy")
    if t.get("energy_per_inference_j") is not None:
        lines.append(f"energy per inference: {t['energy_per_inference_j'] * 1e3:.2f} mJ")
    if snap.unknown:
        lines.append("unknown: " + "; ".join(f"{k}: {v}" for k, v in sorted(snap.unknown.items())))
    recent = list(gov.events)[-8:]
    if recent:
        lines.append("events:")
        for e in recent:
            lines.append(f"  {e.timestamp_ms / 1e3:10.1f} s  {e.kind:10s} {e.action or '':16s} {e.detail} {('(' + e.reason + ')') if e.reason else ''}")
    return "\n".join(lines)


def render_scrape(url: str, samples: list[Any]) -> tuple[str, dict[str, Any]]:
    """The ``--url`` view of a scraped exposition: (text, JSON-ready dict)."""
    by: dict[str, list[Any]] = {}
    for s in samples:
        by.setdefault(s.name, []).append(s)

    def one(name: str) -> float | None:
        v = by.get(name)
        return v[0].value if v else None

    state = next((s.labels.get("state") for s in by.get("edge_sdk_governor_state", []) if s.value == 1), None)
    data: dict[str, Any] = {
        "url": url,
        "state": state,
        "temp_c": one("edge_sdk_temperature_celsius"),
        "soft_c": one("edge_sdk_budget_soft_limit_celsius"),
        "hard_c": one("edge_sdk_budget_hard_limit_celsius"),
        "power_w": one("edge_sdk_board_power_watts"),
        "power_mean_w": one("edge_sdk_board_power_window_watts"),
        "energy_per_inference_j": one("edge_sdk_energy_per_inference_joules"),
        "throttled": one("edge_sdk_firmware_throttled_flags"),
        "temps": {s.labels.get("sensor", "?"): s.value for s in by.get("edge_sdk_sensor_temperature_celsius", [])},
        "rails_w": {s.labels.get("rail", "?"): s.value for s in by.get("edge_sdk_rail_power_watts", [])},
        "actions_applied": [s.labels.get("action") for s in by.get("edge_sdk_governor_action_applied", []) if s.value == 1],
        "events": {s.labels.get("kind", "?"): s.value for s in by.get("edge_sdk_governor_events_total", [])},
        "pipelines": {},
    }
    for s in by.get("edge_sdk_pipeline_frames_processed_total", []):
        data["pipelines"].setdefault(s.labels.get("pipeline", "?"), {})["processed"] = s.value
    for s in by.get("edge_sdk_pipeline_frames_dropped_total", []):
        p = data["pipelines"].setdefault(s.labels.get("pipeline", "?"), {})
        if s.value:
            p.setdefault("dropped", {})[s.labels.get("reason", "?")] = s.value
    data["quality"] = _quality_view(by)
    data["shadow"] = _shadow_view(by)
    lines = [f"edge-sdk monitor  {url}  {datetime.now().strftime('%H:%M:%S')}"]
    if state is None:
        lines.append("no edge_sdk governor metrics at this endpoint")
    else:
        lines.append(
            f"governor: {state.upper()}  temp {_f(data['temp_c'], '.1f', ' C')} (soft {_f(data['soft_c'], 'g')}, hard {_f(data['hard_c'], 'g')})"
        )
        lines.append("  actions in effect: " + (", ".join(a for a in data["actions_applied"] if a) or "none"))
        lines.append("  events: " + ", ".join(f"{k} {v:g}" for k, v in data["events"].items() if v))
    for k, v in data["temps"].items():
        lines.append(f"  {k[:28]:28s} {_f(v, '6.1f', ' C')}")
    if state is not None or data["power_w"] is not None or data["rails_w"]:
        lines.append(f"power: board {_f(data['power_w'], '.2f', ' W')}, window mean {_f(data['power_mean_w'], '.2f', ' W')}")
    for k, v in data["rails_w"].items():
        lines.append(f"  {k[:20]:20s} {_f(v, '7.3f', ' W')}")
    if data["throttled"] is not None:
        lines.append(f"throttled: {int(data['throttled']):#x}")
    for name, p in data["pipelines"].items():
        lines.append(f"pipeline {name}: processed {p.get('processed', 0):g}, dropped {p.get('dropped', {})}")
    for name, q in data["quality"].items():
        worst = max(q["psi"].items(), key=lambda kv: kv[1], default=None)
        alarms = [k for k, on in q["alarms"].items() if on]
        lines.append(
            f"quality {name}: {'DRIFT' if q['drift'] else 'ok'}, alarms {', '.join(alarms) or 'none'}; "
            f"sampled {q['sampled']:g} of {q['requests']:g}, low confidence {_f(q['low_confidence_rate'], '.1%')}, "
            f"schema violations {q['schema_violations']:g}"
            + (f"; max PSI {worst[1]:.3f} ({worst[0]})" if worst else "")
        )
    for name, s in data["shadow"].items():
        lines.append(
            f"shadow {name}: agreement {_f(s['agreement'], '.1%')} (total {_f(s['agreement_total'], '.1%')}), "
            f"{'ALARM' if s['alarm'] else 'ok'}; checked {s['checked']:g} of {s['requests']:g}, skipped {s['skipped']}"
        )
    return "\n".join(lines), data


def _by_model(by: dict[str, list[Any]], name: str, key: str = "model") -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for s in by.get(name, []):
        out.setdefault(s.labels.get(key, "?"), []).append(s)
    return out


def _quality_view(by: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """Per model: the quality monitor's drift state, alarms, rates and PSI per summary."""
    view: dict[str, dict[str, Any]] = {}
    for model, rows in _by_model(by, "edge_sdk_quality_drift").items():
        def one(metric: str, model: str = model) -> float | None:
            v = _by_model(by, metric).get(model)
            return v[0].value if v else None

        view[model] = {
            "drift": bool(rows[0].value),
            "requests": one("edge_sdk_quality_requests_total") or 0.0,
            "sampled": one("edge_sdk_quality_sampled_total") or 0.0,
            "low_confidence_rate": one("edge_sdk_quality_low_confidence_rate"),
            "schema_violations": one("edge_sdk_quality_schema_violations_total") or 0.0,
            "alarms": {s.labels.get("indicator", "?"): bool(s.value) for s in _by_model(by, "edge_sdk_quality_alarm").get(model, [])},
            "psi": {
                s.labels.get("summary", "?"): s.value
                for s in _by_model(by, "edge_sdk_quality_psi").get(model, [])
                if s.value is not None and s.value == s.value  # NaN until a window is full
            },
        }
    return view


def _shadow_view(by: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """Per model (and reference): the shadow checker's agreement, alarm and counts."""
    view: dict[str, dict[str, Any]] = {}
    for s in by.get("edge_sdk_shadow_disagreement", []):
        model, ref = s.labels.get("model", "?"), s.labels.get("reference", "?")

        def mine(metric: str, model: str = model, ref: str = ref) -> list[Any]:
            return [x for x in by.get(metric, []) if x.labels.get("model") == model and x.labels.get("reference") == ref]

        agree = {x.labels.get("scope"): x.value for x in mine("edge_sdk_shadow_agreement")}
        view[f"{model} vs {ref}"] = {
            "alarm": bool(s.value),
            "agreement": agree.get("window"),
            "agreement_total": agree.get("total"),
            "requests": next((x.value for x in mine("edge_sdk_shadow_requests_total")), 0.0),
            "checked": next((x.value for x in mine("edge_sdk_shadow_checked_total")), 0.0),
            "skipped": {x.labels.get("reason", "?"): x.value for x in mine("edge_sdk_shadow_skipped_total") if x.value},
        }
    return view


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The monitor's own options: ``--interval``, ``--count`` and ``--url``."""
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--count", type=int, default=0, help="stop after N samples (default 0: until Ctrl-C)")
    p.add_argument("--url", help="scrape this Prometheus endpoint of a running app (e.g. http://127.0.0.1:9100/metrics) instead")


def run(args: argparse.Namespace, profile: Any = None) -> int:
    """Run ``edge-sdk monitor`` with parsed ``args`` (:func:`add_arguments` plus ``--root`` and ``--json``) and the
    resolved device ``profile`` (None with ``--url``); returns the exit status."""
    return watch(profile=profile, root=args.root, interval_s=args.interval, count=args.count, as_json=args.json, url=args.url)


def watch(
    *,
    profile: Any = None,
    root: str = "/",
    interval_s: float = 1.0,
    count: int = 0,
    as_json: bool = False,
    url: str | None = None,
    out: TextIO | None = None,
    reader: Callable[[], Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """The monitor loop: ``count`` samples (0: until interrupted) every ``interval_s`` seconds, written to ``out``
    (default stdout). ``reader``: a ready ``read()`` (tests); otherwise a SensorReader for ``profile`` under ``root``.
    Raises ``OptionsError`` (a ValueError) for ``interval_s <= 0``, ``count < 0`` or a ``url`` that is not http(s);
    ``ConnectionError`` naming the URL when it cannot be scraped; returns 0."""
    out = out or sys.stdout
    if interval_s <= 0 or count < 0:
        raise OptionsError(f"expected --interval > 0 and --count >= 0, got {interval_s} and {count}")
    tty = not as_json and out.isatty()
    if url is not None:
        import urllib.error
        import urllib.parse
        import urllib.request

        from edge_sdk.telemetry import parse

        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OptionsError(f"--url: expected an http:// or https:// URL such as http://127.0.0.1:9100/metrics, got {url!r}")
        i = 0
        while count == 0 or i < count:
            if i:
                sleep(interval_s)
            i += 1
            try:
                with urllib.request.urlopen(url, timeout=max(2.0, interval_s)) as resp:  # noqa: S310 - the user's own endpoint
                    body = resp.read().decode("utf-8", errors="replace")
            except urllib.error.HTTPError as e:
                raise ConnectionError(f"--url {url}: HTTP {e.code} {e.reason}") from e
            except urllib.error.URLError as e:
                raise ConnectionError(f"--url {url}: cannot connect ({e.reason})") from e
            except OSError as e:  # a timeout while reading, a reset
                raise ConnectionError(f"--url {url}: {type(e).__name__}: {e}") from e
            try:
                samples = parse(body)
            except ValueError as e:
                raise ValueError(f"--url {url}: not a Prometheus text exposition: {e}") from e
            text, data = render_scrape(url, samples)
            out.write(json.dumps(data) + "\n" if as_json else (_CLEAR if tty else "") + text + "\n\n")
            out.flush()
        return 0

    from .governor import Budget, Governor
    from .sensors import SensorReader, psutil_battery

    if reader is None:
        reader = SensorReader(profile, root=root, battery=psutil_battery if str(root) == "/" else None).read
    gov = Governor(reader, Budget.from_profile(profile, sample_interval_s=interval_s) if profile is not None else Budget(80.0, 90.0), actions=[])
    seen = 0
    i = 0
    while count == 0 or i < count:
        if i:
            sleep(interval_s)
        i += 1
        gov.step()
        snap = gov.last_snapshot
        assert snap is not None  # step() always leaves one
        events = list(gov.events)
        new, seen = events[seen:], len(events)
        name = getattr(profile, "name", "no profile")
        if as_json:
            out.write(json.dumps({"profile": name, "sample": i, "snapshot": snap.to_dict(), "governor": gov.telemetry(last_events=0),
                                  "events": [e.to_dict() for e in new]}, default=str) + "\n")  # fmt: skip
        else:
            out.write((_CLEAR if tty else "") + render_local(name, i, snap, gov, new) + "\n\n")
        out.flush()
    return 0
