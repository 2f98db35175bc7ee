"""Kill the store updater with SIGKILL at many points and check every restart.

Run by tests/test_store_kill.py in a fresh interpreter (so no runtime threads
exist before it forks). Each round: copy a template store (v1 active), fork an
updater that installs v2 and SIGKILLs itself at crash point N (the
EDGE_SDK_STORE_CRASH_AT hook: every journal append, fsync, copy, rename and
pointer write), or is killed by this process after a random delay (to land
inside the health check); every third round, recovery itself is killed at a
random point once more; then reopen the store (recovery) and check it.

    python tests/store_kill_driver.py ROUNDS DELAY_ROUNDS SEED   # prints a JSON summary
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from store_helpers import make_pkg  # noqa: E402

from edge_sdk.package import ModelPackage  # noqa: E402
from edge_sdk.store import ModelStore, StoreConfig, run_health_check  # noqa: E402
from edge_sdk.store._fs import COUNTER, CRASH_ENV  # noqa: E402
from edge_sdk.store.journal import TERMINAL_STATES  # noqa: E402


def _updater(root: Path, pkg: Path, crash_at: int | None) -> None:
    """The child: install v2; exit 0 when no crash point fired."""
    COUNTER[0] = 0
    if crash_at is not None:
        os.environ[CRASH_ENV] = str(crash_at)
    code = 0
    try:
        ModelStore(root).install(pkg)
    except BaseException:
        code = 3
    os._exit(code)


def _check(root: Path, load: bool) -> dict[str, object]:
    store = ModelStore(root)  # recovery happens here
    updates = store.journal.updates()
    for u in updates.values():
        assert len(u.terminals) == 1 and u.terminal in TERMINAL_STATES, f"not exactly one terminal state: {u}"
    installs = [u for u in updates.values() if u.phases and u.phases[0].get("source", "").endswith("v2")]
    assert len(installs) <= 1
    path = store.active_path("mlp")
    assert path is not None, "no active version after recovery"
    version = ModelPackage.open(path).manifest.version  # every digest verified: no partial, no mixed file
    want = "2.0" if installs and installs[0].terminal == "succeeded" else "1.0"
    assert version == want, f"active {version}, journal says {installs[0].terminal if installs else 'no update'}"
    for v in store.versions():
        ModelPackage.open(v.path)
        assert v.version in ("1.0", "2.0")
    assert not any((root / "staging").iterdir()) and not any((root / "trash").iterdir())
    assert not [p for p in (root / "active").iterdir() if p.name.startswith(".")]
    if load:
        h = run_health_check(path, 30.0, start_method="fork")
        assert h.ok, h.reason
    return {"state": installs[0].terminal if installs else "not_begun", "version": version}


def main() -> None:
    rounds, delay_rounds, seed = (int(a) for a in sys.argv[1:4])
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="store-kill-"))
    os.environ["EDGE_SDK_CACHE"] = str(tmp / "cache")
    try:
        v1, v2 = make_pkg(tmp / "v1", "1.0"), make_pkg(tmp / "v2", "2.0", seed=1)
        template = tmp / "template"
        assert ModelStore(template, StoreConfig(health_start_method="fork", health_timeout_s=30)).install(v1).ok
        # size the range of crash points with one uninterrupted run
        probe = tmp / "probe"
        shutil.copytree(template, probe)
        COUNTER[0] = 0
        t0 = time.monotonic()
        assert ModelStore(probe).install(v2).ok
        n_points, clean_s = COUNTER[0], time.monotonic() - t0
        points = list(range(1, n_points + 1))
        rng.shuffle(points)
        plan: list[tuple[str, float]] = [("index", float(points[i % n_points])) for i in range(rounds)]
        plan += [("delay", rng.uniform(0.0, clean_s * 1.2)) for _ in range(delay_rounds)]
        states: dict[str, int] = {}
        killed = recovery_kills = 0
        t_start = time.monotonic()
        for i, (how, arg) in enumerate(plan):
            root = tmp / f"r{i}"
            shutil.copytree(template, root)
            pid = os.fork()
            if pid == 0:
                _updater(root, v2, int(arg) if how == "index" else None)
            if how == "delay":
                time.sleep(arg)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                assert os.WTERMSIG(status) == signal.SIGKILL
                killed += 1
            else:
                assert os.WEXITSTATUS(status) == 0, f"updater failed without a crash (round {i})"
            if i % 3 == 0:  # a second power loss, during recovery itself
                pid = os.fork()
                if pid == 0:
                    COUNTER[0] = 0
                    os.environ[CRASH_ENV] = str(rng.randint(1, 8))
                    ModelStore(root)
                    os._exit(0)
                os.waitpid(pid, 0)
                recovery_kills += 1
            res = _check(root, load=i % 25 == 0)
            states[str(res["state"])] = states.get(str(res["state"]), 0) + 1
            shutil.rmtree(root)
        summary = {"crash_points": n_points, "rounds": len(plan), "killed": killed, "recovery_kills": recovery_kills, "states": states}
        summary |= {"clean_install_s": round(clean_s, 3), "loop_s": round(time.monotonic() - t_start, 2)}
        print(json.dumps(summary))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
