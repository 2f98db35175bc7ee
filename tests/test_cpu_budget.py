"""Threads come from what the process may use: the affinity mask, then the cgroup CPU quota, then the profile.

Fake /proc and /sys trees are the real interfaces (proc(5) ``Cpus_allowed_list``, cgroup v2
``cpu.max``, cgroup v1 ``cpu.cfs_quota_us``); the host checks run real subprocesses under a real
affinity mask (``os.sched_setaffinity`` in the child before it imports edge_sdk).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk import LoadOptions
from edge_sdk.profiles import HardwareFacts, load_profile, read_facts, resolve_profile, usable_cpus

CPUINFO = "".join(f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nflags\t\t: fpu avx2\n\n" for i in range(8))


def _tree(tmp_path: Path, *, allowed: str | None = None, cgroup: str | None = None, files: dict[str, str] | None = None) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/cpuinfo").write_text(CPUINFO)
    if allowed is not None:
        (tmp_path / "proc/self/status").write_text(f"Name:\tpython\nCpus_allowed:\tff\nCpus_allowed_list:\t{allowed}\n")
    if cgroup is not None:
        (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for rel, text in (files or {}).items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("allowed", "count"),
    [("0-7", 8), ("0", 1), ("0,2", 2), ("0-1,4-5,7", 5), ("3-3", 1)],
)
def test_affinity_list_from_proc_status(tmp_path: Path, allowed: str, count: int) -> None:
    f = read_facts(_tree(tmp_path, allowed=allowed))
    assert f.cpu_count == 8
    assert f.cpus_allowed == count
    assert f.usable_cpus == count


def test_garbled_affinity_list_is_an_absent_fact(tmp_path: Path) -> None:
    f = read_facts(_tree(tmp_path, allowed="0-x"))
    assert f.cpus_allowed is None and f.usable_cpus == 8


@pytest.mark.parametrize(
    ("cpu_max", "quota", "usable"),
    [
        ("max 100000\n", None, 8),  # no limit
        ("200000 100000\n", 2.0, 2),
        ("150000 100000\n", 1.5, 2),  # rounded up, as the JDK and Go do
        ("50000 100000\n", 0.5, 1),  # never below one
        ("garbage\n", None, 8),
    ],
)
def test_cgroup_v2_quota(tmp_path: Path, cpu_max: str, quota: float | None, usable: int) -> None:
    root = _tree(tmp_path, allowed="0-7", cgroup="0::/user.slice/app\n", files={"sys/fs/cgroup/user.slice/app/cpu.max": cpu_max})
    f = read_facts(root)
    assert f.cpu_quota == quota
    assert f.usable_cpus == usable


def test_cgroup_v2_parent_limit_applies(tmp_path: Path) -> None:
    # limits nest: the tightest on the way up to the mount root is what the process gets
    root = _tree(
        tmp_path,
        allowed="0-7",
        cgroup="0::/a/b\n",
        files={"sys/fs/cgroup/a/b/cpu.max": "max 100000", "sys/fs/cgroup/a/cpu.max": "300000 100000"},
    )
    assert read_facts(root).usable_cpus == 3


def test_cgroup_v2_namespaced_container_reads_the_mount_root(tmp_path: Path) -> None:
    # inside a container the cgroup path may name the host's hierarchy; the container's own limit is at the root
    root = _tree(tmp_path, cgroup="0::/docker/0123abcd\n", files={"sys/fs/cgroup/cpu.max": "100000 100000"})
    f = read_facts(root)
    assert f.cpus_allowed is None and f.cpu_quota == 1.0 and f.usable_cpus == 1


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    files = {
        "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us": "250000\n",
        "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us": "100000\n",
    }
    root = _tree(tmp_path, allowed="0-7", cgroup="12:memory:/kubepods/pod1\n4:cpu,cpuacct:/kubepods/pod1\n", files=files)
    f = read_facts(root)
    assert f.cpu_quota == 2.5 and f.usable_cpus == 3
    # -1 is "no limit"
    (root / "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us").write_text("-1\n")
    assert read_facts(root).cpu_quota is None


def test_affinity_and_quota_take_the_smaller(tmp_path: Path) -> None:
    root = _tree(tmp_path, allowed="0-1", cgroup="0::/\n", files={"sys/fs/cgroup/cpu.max": "400000 100000"})
    assert read_facts(root).usable_cpus == 2
    assert HardwareFacts(cpu_count=8, cpus_allowed=6, cpu_quota=3.2).usable_cpus == 4


def test_threads_are_the_profile_capped_by_usable_cpus(tmp_path: Path) -> None:
    root = _tree(tmp_path, allowed="0", cgroup="0::/\n")
    det = resolve_profile("generic-x86_64", root=root)
    assert det.profile.runtime.threads > 1  # the profile asks for more than the mask allows
    assert det.threads == 1
    assert "capped by the affinity mask: 1 usable CPU" in det.explain()
    assert det.to_dict()["threads"] == 1
    opts = LoadOptions().session_options(det.profile, tmp_path, det.facts.usable_cpus)
    assert opts.threads == 1
    assert LoadOptions(threads=3).session_options(det.profile, tmp_path, det.facts.usable_cpus).threads == 3  # explicit wins
    quota = _tree(tmp_path / "q", allowed="0-7", cgroup="0::/\n", files={"sys/fs/cgroup/cpu.max": "200000 100000"})
    detq = resolve_profile(load_profile("generic-x86_64"), root=quota)
    assert detq.threads == 2 and "cgroup CPU quota: 2 usable CPUs" in detq.explain()


_CHILD = """
import json, os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
import edge_sdk
from edge_sdk.profiles import resolve_profile, usable_cpus
det = resolve_profile()
m = edge_sdk.load(edge_sdk.demo_package_path(), profile=det.profile)
print(json.dumps({"usable": usable_cpus(), "threads": det.threads, "session": m.session.info.threads}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs in the mask")
def test_a_process_under_an_affinity_mask_gets_one_thread(tmp_path: Path) -> None:
    first = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(first)], capture_output=True, text=True, timeout=120, env={**os.environ, "EDGE_SDK_CACHE": str(tmp_path)}
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"usable": 1, "threads": 1, "session": 1}
    assert usable_cpus() == len(os.sched_getaffinity(0))  # this process, unpinned


def test_profile_command_shows_where_threads_come_from(tmp_path: Path) -> None:
    root = _tree(tmp_path, allowed="0-2", cgroup="0::/\n")
    out = subprocess.run(
        [sys.executable, "-m", "edge_sdk.cli", "profile", "--root", str(root), "--profile", "generic-x86_64", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["facts"]["cpus_allowed"] == 3 and data["facts"]["cpu_count"] == 8
    text = subprocess.run(
        [sys.executable, "-m", "edge_sdk.cli", "profile", "--root", str(root), "--profile", "generic-x86_64"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "cpus: 3 usable (8 on the machine, 3 in this process's affinity mask, no cgroup CPU quota)" in text
    assert "threads 3 (the profile's 4 capped by the affinity mask: 3 usable CPUs)" in text
