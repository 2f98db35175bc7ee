"""Tests for edge_sdk.profiles: bundled profiles, validation, facts, detection, overrides.

Hardware is faked with recorded-style trees under tests/fixtures/devices/<name>/
(see the README there for where each string comes from).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from edge_sdk import profiles
from edge_sdk.errors import EdgeSDKError, ProfileError
from edge_sdk.profiles import (
    ENV_VAR,
    DeviceProfile,
    HardwareFacts,
    ThermalSpec,
    detect,
    effective_memory_budget_mb,
    list_profiles,
    load_profile,
    profiles_dir,
    read_facts,
    resolve_profile,
)
from edge_sdk.profiles import profile as profile_module

FIXTURES = Path(__file__).parent / "fixtures" / "devices"
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
REQUIRED = {
    "raspberry-pi-3",
    "raspberry-pi-zero-2-w",
    "raspberry-pi-4",
    "raspberry-pi-400",
    "raspberry-pi-cm4",
    "raspberry-pi-5",
    "raspberry-pi-500",
    "raspberry-pi-cm5",
    "jetson-nano",
    "jetson-orin-nano",
    "jetson-orin-nx-8gb",
    "jetson-orin-nx-16gb",
    "jetson-agx-orin",
    "generic-x86_64",
    "generic-aarch64",
}
#: Where a board's own figures must come from: its vendor's documentation (generic profiles: the kernel's).
VENDOR_HOSTS = {
    "raspberry-pi": ("www.raspberrypi.com", "datasheets.raspberrypi.com"),
    "jetson": ("docs.nvidia.com", "developer.nvidia.com"),
    "generic": ("www.kernel.org", "docs.kernel.org"),
}


def fx(name: str) -> Path:
    path = FIXTURES / name
    assert path.is_dir(), f"missing fixture {path}"
    return path


# --------------------------------------------------------------------------- bundled profiles


def test_bundled_profile_names() -> None:
    assert set(list_profiles()) == REQUIRED
    assert list_profiles() == sorted(list_profiles())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_bundled_profile_loads_and_validates(name: str) -> None:
    profile = load_profile(name)
    path = profiles_dir() / f"{name}.toml"
    assert profile.name == name
    assert profile.path == path
    assert profile.sources, "every bundled profile must cite its sources"
    assert profile.thermal.warn_c < profile.thermal.critical_c < profile.thermal.vendor_throttle_c
    assert profile.generic == name.startswith("generic-")
    assert isinstance(profile.runtime.precisions, tuple) and isinstance(profile.thermal.zones, tuple)
    # to_dict mirrors the file exactly (nothing dropped or renamed) and is JSON-clean.
    as_dict = profile.to_dict()
    assert as_dict.pop("path") == str(path)
    with path.open("rb") as fh:
        assert as_dict == tomllib.load(fh)
    json.dumps(profile.to_dict())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_profile_cites_vendor_urls(name: str) -> None:
    """Every profile has a ``sources`` list, and at least one entry is a URL of the vendor's own documentation."""
    profile = load_profile(name)
    urls = [m.group(0) for s in profile.sources for m in re.finditer(r"https://[^\s)]+", s)]
    hosts = next(v for k, v in VENDOR_HOSTS.items() if name.startswith(k))
    assert any(u.split("/")[2] in hosts for u in urls), f"{name}: no source URL on {hosts}: {urls}"


@pytest.mark.parametrize(
    ("name", "has_fp16", "providers", "sensor", "camera"),
    [
        # Cortex-A53 (Pi 3, Zero 2 W) and A72 (Pi 4 family): no fp16 arithmetic; CPU only; voltages only
        ("raspberry-pi-3", False, ("CPUExecutionProvider",), "pi-volts", "picamera2://0"),
        ("raspberry-pi-zero-2-w", False, ("CPUExecutionProvider",), "pi-volts", "picamera2://0"),
        ("raspberry-pi-4", False, ("CPUExecutionProvider",), "pi-volts", "picamera2://0"),
        ("raspberry-pi-400", False, ("CPUExecutionProvider",), "pi-volts", "v4l2:///dev/video0"),  # no CSI connector
        ("raspberry-pi-cm4", False, ("CPUExecutionProvider",), "pi-volts", "picamera2://0"),
        ("raspberry-pi-500", True, ("CPUExecutionProvider",), "pi5-pmic", "v4l2:///dev/video0"),  # no CSI connector
        ("raspberry-pi-cm5", True, ("CPUExecutionProvider",), "pi5-pmic", "picamera2://0"),
        ("jetson-orin-nx-8gb", True, GPU_PROVIDERS, "ina3221", "csi://0"),
        ("jetson-orin-nx-16gb", True, GPU_PROVIDERS, "ina3221", "csi://0"),
        # Cortex-A76: fphp/asimdhp; PMIC ADC gives current too
        ("raspberry-pi-5", True, ("CPUExecutionProvider",), "pi5-pmic", "picamera2://0"),
        # Maxwell GPU fp16 through TensorRT/CUDA
        ("jetson-nano", True, GPU_PROVIDERS, "ina3221", "csi://0"),
        # Ampere GPU
        ("jetson-orin-nano", True, GPU_PROVIDERS, "ina3221", "csi://0"),
        ("jetson-agx-orin", True, GPU_PROVIDERS, "ina3221", "csi://0"),
        # unknown CPUs: fp16 not assumed
        ("generic-x86_64", False, ("CPUExecutionProvider",), "rapl", "v4l2:///dev/video0"),
        ("generic-aarch64", False, ("CPUExecutionProvider",), "none", "v4l2:///dev/video0"),
    ],
)
def test_bundled_profile_hardware_choices(
    name: str, has_fp16: bool, providers: tuple[str, ...], sensor: str, camera: str
) -> None:
    profile = load_profile(name)
    assert ("fp16" in profile.runtime.precisions) is has_fp16
    assert profile.runtime.onnxruntime_providers == providers
    assert profile.power.sensor == sensor
    assert profile.camera_source == camera


@pytest.mark.parametrize(
    ("name", "vendor_throttle_c", "budget_w"),
    [
        ("raspberry-pi-4", 80.0, 15.0),  # RPi frequency-management doc; 5 V 3 A
        ("raspberry-pi-5", 80.0, 25.0),  # RPi frequency-management doc; 5 V 5 A
        ("jetson-nano", 97.0, 10.0),  # L4T DTB CPU-therm cpu_throttle; MaxN 10 W
        ("jetson-orin-nano", 99.0, 15.0),  # T234 sw-throttle; 15 W mode (pre-Super)
        ("jetson-agx-orin", 99.0, 60.0),  # T234 sw-throttle; 64 GB module max
        ("jetson-orin-nx-16gb", 99.0, 25.0),  # T234 sw-throttle; 10/15/25 W + MAXN
        ("jetson-orin-nx-8gb", 99.0, 20.0),  # T234 sw-throttle; 10/15/20 W
        ("raspberry-pi-3", 60.0, 12.5),  # 3B+ soft limit 60 C (temp_soft_limit); 5.1 V 2.5 A
        ("raspberry-pi-zero-2-w", 80.0, 12.5),  # 80 C progressive throttle; 5 V 2.5 A
        ("raspberry-pi-400", 80.0, 15.0),  # 5 V 3 A USB-C
        ("raspberry-pi-500", 80.0, 25.0),  # 5 V 5 A USB-C PD
        ("raspberry-pi-cm4", 80.0, 0.0),  # the carrier's supply: unknown
        ("raspberry-pi-cm5", 80.0, 0.0),
    ],
)
def test_vendor_numbers(name: str, vendor_throttle_c: float, budget_w: float) -> None:
    profile = load_profile(name)
    assert profile.thermal.vendor_throttle_c == vendor_throttle_c
    assert profile.power.budget_w == budget_w


@pytest.mark.parametrize(
    ("name", "threads", "cap_mb"),
    [
        ("jetson-orin-nx-16gb", 8, 8192),  # 8x Cortex-A78AE, 16 GB
        ("jetson-orin-nx-8gb", 6, 4096),  # 6x Cortex-A78AE, 8 GB
        ("raspberry-pi-3", 4, 512),  # 4x Cortex-A53, 1 GB
        ("raspberry-pi-zero-2-w", 4, 256),  # 4x Cortex-A53, 512 MB
    ],
)
def test_cores_and_memory(name: str, threads: int, cap_mb: int) -> None:
    runtime = load_profile(name).runtime
    assert (runtime.threads, runtime.memory_budget_mb) == (threads, cap_mb)


# --------------------------------------------------------------------------- bad TOML files

PI5_TEXT = (Path(profiles_dir()) / "raspberry-pi-5.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        # typo in a runtime key must not pass silently
        ("threads = 4 ", "thread = 4 ", "runtime.thread"),
        # unknown top-level key
        ("generic = false", "generic = false\nnotes = 'x'", "notes"),
        # unknown key inside [thermal]
        ("warn_c = 70.0", "warn_c = 70.0\nwarn_f = 158.0", "thermal.warn_f"),
        # warn_c >= critical_c
        ("warn_c = 70.0", "warn_c = 77.0", "thermal.warn_c"),
        # critical_c >= vendor_throttle_c
        ("critical_c = 77.0", "critical_c = 80.0", "thermal.critical_c"),
        # unknown precision
        ('precisions = ["int8", "fp16", "fp32", "int4"]', 'precisions = ["int8", "bf16"]', "runtime.precisions"),
        # unknown backend
        ('backends = ["litert", "onnxruntime"]', 'backends = ["tflite"]', "runtime.backends"),
        # unknown optimisation level
        ('graph_optimization = "all"', 'graph_optimization = "max"', "runtime.graph_optimization"),
        # unknown power sensor
        ('sensor = "pi5-pmic"', 'sensor = "ina219"', "power.sensor"),
        # threads must be >= 1
        ("threads = 4 ", "threads = 0 ", "runtime.threads"),
        # a bool is not an integer
        ("threads = 4 ", "threads = true ", "runtime.threads"),
        # fraction outside (0, 1]
        ("memory_budget_fraction = 0.5", "memory_budget_fraction = 1.5", "runtime.memory_budget_fraction"),
        ("memory_budget_fraction = 0.5", "memory_budget_fraction = 0.0", "runtime.memory_budget_fraction"),
        # a bare string where a list is expected
        ('zones = ["cpu-thermal"]', 'zones = "cpu-thermal"', "thermal.zones"),
        # duplicated provider
        (
            'onnxruntime_providers = ["CPUExecutionProvider"]',
            'onnxruntime_providers = ["CPUExecutionProvider", "CPUExecutionProvider"]',
            "runtime.onnxruntime_providers",
        ),
        # provider name typo
        ('onnxruntime_providers = ["CPUExecutionProvider"]', 'onnxruntime_providers = ["CPU"]', "runtime.onnxruntime_providers"),
        # unsupported arch
        ('arch = "aarch64"', 'arch = "armv7l"', "arch"),
        # wrong schema version
        ("schema = 1", "schema = 2", "schema"),
        # name must equal the file stem
        ('name = "raspberry-pi-5"', 'name = "raspberry-pi-6"', "name"),
        # a whole table missing
        ('[camera]\ndefault_source = "picamera2://0"', "", "camera"),
        # a non-generic profile needs something to match on
        ('device_tree_model = ["Raspberry Pi 5"]', "device_tree_model = []", "match"),
        # negative budget
        ("budget_w = 25.0", "budget_w = -1.0", "power.budget_w"),
    ],
)
def test_bad_profile_names_file_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    text = PI5_TEXT
    if old == 'device_tree_model = ["Raspberry Pi 5"]':
        # empty every pattern list, not just one
        text = re.sub(r"device_tree_compatible = \[.*\]", "device_tree_compatible = []", text)
    assert old in text, f"test setup: {old!r} not found in the profile text"
    path = tmp_path / "raspberry-pi-5.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message
    assert re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message), message


def test_bad_toml_syntax(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("schema = 1\nname = \n", encoding="utf-8")
    with pytest.raises(ProfileError, match="not valid TOML") as info:
        load_profile(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, EdgeSDKError)


def test_missing_file_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "nope.toml")
    with pytest.raises(ProfileError) as info:
        load_profile("raspberry-pi-6")
    message = str(info.value)
    assert "raspberry-pi-6" in message
    for name in REQUIRED:  # the error lists the known names
        assert name in message


# --------------------------------------------------------------------------- dataclasses


def test_specs_are_frozen_tuples_and_validated() -> None:
    base = load_profile("raspberry-pi-5")
    runtime = dataclasses.replace(base.runtime, precisions=["fp32"], backends=["onnxruntime"])
    assert runtime.precisions == ("fp32",) and runtime.backends == ("onnxruntime",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.threads = 2  # type: ignore[misc]
    with pytest.raises(ProfileError, match=r"thermal\.warn_c"):
        ThermalSpec(zones=(), vendor_throttle_c=80.0, warn_c=77.0, critical_c=77.0)
    with pytest.raises(ProfileError, match=r"thermal\.critical_c"):
        ThermalSpec(zones=(), vendor_throttle_c=80.0, warn_c=70.0, critical_c=85.0)
    with pytest.raises(ProfileError, match=r"runtime\.precisions.*'fp8'"):
        dataclasses.replace(base.runtime, precisions=("fp8",))
    with pytest.raises(ProfileError, match=r"runtime\.precisions"):
        dataclasses.replace(base.runtime, precisions=())
    with pytest.raises(ProfileError, match=r"name: expected 'generic-aarch64'"):
        dataclasses.replace(base, generic=True, name="generic-arm")
    with pytest.raises(ProfileError, match=r"camera\.default_source"):
        dataclasses.replace(base, camera_source="/dev/video0")


# --------------------------------------------------------------------------- facts


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        # NUL terminator stripped; machine inferred from the Arm cpuinfo
        (
            "raspberry-pi-4",
            dict(
                machine="aarch64",
                device_tree_model="Raspberry Pi 4 Model B Rev 1.4",
                device_tree_compatible=("raspberrypi,4-model-b", "brcm,bcm2711"),
                nv_tegra_release=None,
                l4t_release=None,
                cpu_model="Cortex-A72",
                cpu_count=4,
                mem_total_mb=3793,
                has_arm_dotprod=False,
                has_arm_fp16=False,
            ),
        ),
        # Cortex-A76 has dotprod and fp16, not i8mm
        (
            "raspberry-pi-5",
            dict(
                machine="aarch64",
                device_tree_model="Raspberry Pi 5 Model B Rev 1.0",
                cpu_model="Cortex-A76",
                cpu_count=4,
                mem_total_mb=8052,
                has_arm_dotprod=True,
                has_arm_fp16=True,
                has_arm_i8mm=False,
            ),
        ),
        # device tree only under /sys/firmware/devicetree/base
        (
            "raspberry-pi-cm4-sysfs-only",
            dict(
                device_tree_model="Raspberry Pi Compute Module 4 Rev 1.0",
                device_tree_compatible=("raspberrypi,4-compute-module", "brcm,bcm2711"),
            ),
        ),
        # L4T R32: first line kept, release parsed; 'model name' ignored for a known Arm part
        (
            "jetson-nano",
            dict(
                nv_tegra_release="# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, "
                "EABI: aarch64, DATE: Sat Feb 19 17:05:08 UTC 2022",
                l4t_release="R32.7.1",
                cpu_model="Cortex-A57",
                mem_total_mb=3964,
                has_arm_fp16=False,
            ),
        ),
        # R36 file has extra lines; only the first counts
        ("jetson-orin-nano", dict(l4t_release="R36.4.3", cpu_model="Cortex-A78AE", cpu_count=6, has_arm_dotprod=True)),
        ("jetson-agx-orin", dict(l4t_release="R36.4.4", cpu_count=12, mem_total_mb=62827)),
        # unknown implementer (NVIDIA Carmel): falls back to 'model name'
        ("jetson-xavier-nx", dict(cpu_model="ARMv8 Processor rev 0 (v8l)", has_arm_fp16=True, has_arm_dotprod=False)),
        # big.LITTLE: both core types named
        ("rockchip-rk3588", dict(cpu_model="Cortex-A55 + Cortex-A76", cpu_count=8, has_arm_dotprod=True)),
        # x86: machine inferred from 'flags'/'vendor_id'
        (
            "x86-64-avx512-vnni",
            dict(
                machine="x86_64",
                device_tree_model=None,
                device_tree_compatible=(),
                cpu_model="Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz",
                cpu_count=4,
                mem_total_mb=15921,
                has_avx512_vnni=True,
                has_avx_vnni=False,
                has_arm_dotprod=False,
            ),
        ),
    ],
)
def test_read_facts(fixture: str, expected: dict) -> None:
    facts = read_facts(fx(fixture))
    for attribute, value in expected.items():
        assert getattr(facts, attribute) == value, attribute


def test_read_facts_missing_everything(tmp_path: Path) -> None:
    facts = read_facts(tmp_path)
    assert facts == HardwareFacts()
    # a directory where a file should be is an absent fact, not an exception
    (tmp_path / "proc" / "device-tree" / "model").mkdir(parents=True)
    (tmp_path / "proc" / "cpuinfo").mkdir()
    assert read_facts(tmp_path, machine="arm64") == HardwareFacts(machine="aarch64")


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("arm64", "aarch64"),  # macOS / Debian spelling
        ("AMD64", "x86_64"),  # Windows spelling
        ("x86_64", "x86_64"),
        ("aarch64", "aarch64"),
        ("armv7l", "armv7l"),  # unknown arches pass through (and are rejected by detect)
    ],
)
def test_machine_normalisation(tmp_path: Path, given: str, normalised: str) -> None:
    assert read_facts(tmp_path, machine=given).machine == normalised


def test_read_facts_host_root_uses_platform() -> None:
    import platform

    facts = read_facts("/")
    assert facts.machine == HardwareFacts(machine=platform.machine()).machine
    assert facts.cpu_count is not None and facts.cpu_count >= 1


@pytest.mark.parametrize(
    ("features", "prop", "value"),
    [
        ({"avx512_vnni", "avx512f"}, "has_avx512_vnni", True),
        ({"avx512f"}, "has_avx512_vnni", False),
        ({"AVX_VNNI"}, "has_avx_vnni", True),  # flags are lower-cased
        ({"avx512_vnni"}, "has_avx_vnni", False),
        ({"asimddp"}, "has_arm_dotprod", True),
        ({"asimd"}, "has_arm_dotprod", False),
        ({"fphp", "asimdhp"}, "has_arm_fp16", True),
        ({"fphp"}, "has_arm_fp16", False),  # scalar fp16 alone is not enough
        ({"i8mm"}, "has_arm_i8mm", True),
        (set(), "has_arm_i8mm", False),
    ],
)
def test_cpu_feature_properties(features: set[str], prop: str, value: bool) -> None:
    assert getattr(HardwareFacts(cpu_features=frozenset(features)), prop) is value


# --------------------------------------------------------------------------- detection

DETECTION_ROWS = [
    # Pi 4: model substring and compatible entries
    ("raspberry-pi-4", None, "raspberry-pi-4", "detected",
     ["device-tree model 'Raspberry Pi 4 Model B Rev 1.4' contains 'Raspberry Pi 4'", "'raspberrypi,4-model-b'"]),
    # Pi 5
    ("raspberry-pi-5", None, "raspberry-pi-5", "detected",
     ["device-tree model 'Raspberry Pi 5 Model B Rev 1.0' contains 'Raspberry Pi 5'", "'brcm,bcm2712'"]),
    # CM4 with the device tree only under /sys/firmware/devicetree/base
    ("raspberry-pi-cm4-sysfs-only", None, "raspberry-pi-cm4", "detected",
     ["contains 'Raspberry Pi Compute Module 4'", "'raspberrypi,4-compute-module'", "more specific than raspberry-pi-4"]),
    # the Pi models still sold that run a 64-bit OS: each has its own profile, not its SoC sibling's
    ("raspberry-pi-3b-plus", None, "raspberry-pi-3", "detected",
     ["'Raspberry Pi 3 Model B Plus Rev 1.3' contains 'Raspberry Pi 3 Model B'", "'raspberrypi,3-model-b-plus'"]),
    ("raspberry-pi-3b", None, "raspberry-pi-3", "detected",
     ["'Raspberry Pi 3 Model B Rev 1.2' contains 'Raspberry Pi 3 Model B'", "'raspberrypi,3-model-b'"]),
    ("raspberry-pi-zero-2-w", None, "raspberry-pi-zero-2-w", "detected",
     ["'Raspberry Pi Zero 2 W Rev 1.0' contains 'Raspberry Pi Zero 2'", "'raspberrypi,model-zero-2-w'"]),
    ("raspberry-pi-400", None, "raspberry-pi-400", "detected",
     ["'Raspberry Pi 400 Rev 1.0' contains 'Raspberry Pi 400'", "'raspberrypi,400'", "more specific than raspberry-pi-4"]),
    ("raspberry-pi-500", None, "raspberry-pi-500", "detected",
     ["'Raspberry Pi 500 Rev 1.0' contains 'Raspberry Pi 500'", "'raspberrypi,500'", "more specific than raspberry-pi-5"]),
    ("raspberry-pi-cm5", None, "raspberry-pi-cm5", "detected",
     ["'Raspberry Pi Compute Module 5 Rev 1.0' contains 'Raspberry Pi Compute Module 5'", "'raspberrypi,5-compute-module'",
      "more specific than raspberry-pi-5"]),
    # Orin NX: the module SKU in the compatible list decides (16 GB p3767-0000, 8 GB p3767-0001)
    ("jetson-orin-nx-16gb", None, "jetson-orin-nx-16gb", "detected", ["device-tree compatible lists 'nvidia,p3767-0000'"]),
    ("jetson-orin-nx-8gb", None, "jetson-orin-nx-8gb", "detected", ["device-tree compatible lists 'nvidia,p3767-0001'"]),
    # an Orin Nano module on the shared p3768 carrier whose model string says "Orin NX": the module SKU wins
    ("jetson-orin-nano-nx-model", None, "jetson-orin-nano", "detected", ["device-tree compatible lists 'nvidia,p3767-0003'"]),
    # Jetson Nano
    ("jetson-nano", None, "jetson-nano", "detected",
     ["device-tree model 'NVIDIA Jetson Nano Developer Kit' contains 'Jetson Nano'", "'nvidia,jetson-nano'"]),
    # Orin Nano devkit must not become jetson-nano
    ("jetson-orin-nano", None, "jetson-orin-nano", "detected",
     ["device-tree model 'NVIDIA Jetson Orin Nano Developer Kit' contains 'Jetson Orin Nano'", "'nvidia,p3767-0005'"]),
    # Orin Nano Super (JetPack 6.2 device tree)
    ("jetson-orin-nano-super", None, "jetson-orin-nano", "detected",
     ["contains 'Jetson Orin Nano'", "'nvidia,p3767-0005'"]),
    # JetPack 5 model string lacks 'Jetson'
    ("jetson-orin-nano-jp5", None, "jetson-orin-nano", "detected",
     ["'NVIDIA Orin Nano Developer Kit' contains 'Orin Nano'", "'nvidia,p3767-0003'"]),
    # AGX Orin must not become orin-nano
    ("jetson-agx-orin", None, "jetson-agx-orin", "detected",
     ["'NVIDIA Jetson AGX Orin Developer Kit' contains 'Jetson AGX Orin'", "'nvidia,p3701-0005'"]),
    # JetPack 5 AGX Orin model string 'Jetson AGX Orin'
    ("jetson-agx-orin-jp5", None, "jetson-agx-orin", "detected",
     ["device-tree model 'Jetson AGX Orin' contains 'Jetson AGX Orin'"]),
    # container without a device tree: the L4T release alone decides
    ("jetson-release-only-r32", None, "jetson-nano", "detected", ["starts with 'R32'"]),
    # R36 is shared by all Orins: ambiguous, the smaller power budget is chosen and the reason says so
    ("jetson-release-only-r36", None, "jetson-orin-nano", "detected",
     ["starts with 'R36'", "ambiguous: jetson-orin-nano, jetson-orin-nx-8gb, jetson-orin-nx-16gb, jetson-agx-orin", ENV_VAR]),
    # Xavier NX on R32: the device tree says it is not a Nano, so R32 does not count
    ("jetson-xavier-nx", None, "generic-aarch64", "fallback",
     ["no aarch64 profile matched", "'NVIDIA Jetson Xavier NX Developer Kit'", "using generic-aarch64"]),
    # unknown Arm board
    ("rockchip-rk3588", None, "generic-aarch64", "fallback",
     ["no aarch64 profile matched (device-tree model 'Radxa ROCK 5B'", "using generic-aarch64"]),
    # plain x86 box
    ("x86-64-avx512-vnni", None, "generic-x86_64", "fallback",
     ["no x86_64 profile matched (no device-tree model", "using generic-x86_64"]),
    # arch must match: a Pi 5 tree on an x86 machine is not a Pi 5
    ("raspberry-pi-5", "x86_64", "generic-x86_64", "fallback",
     ["using generic-x86_64", "raspberry-pi-5 matched", "needs aarch64, not x86_64"]),
]


@pytest.mark.parametrize(("fixture", "machine", "profile", "source", "reason_parts"), DETECTION_ROWS)
def test_detect_fixture(fixture: str, machine: str | None, profile: str, source: str, reason_parts: list[str]) -> None:
    det = detect(fx(fixture), machine=machine)
    assert det.profile.name == profile
    assert det.source == source
    assert det.fallback is (source == "fallback")
    joined = "\n".join(det.reasons)
    for part in reason_parts:
        assert part in joined, f"{part!r} not in reasons:\n{joined}"
    explained = det.explain()
    assert f"profile: {profile}" in explained and f"[{source}]" in explained
    json.dumps(det.to_dict())


def test_orin_strings_never_resolve_to_the_wrong_nano() -> None:
    for fixture in ("jetson-orin-nano", "jetson-orin-nano-super", "jetson-orin-nano-jp5"):
        assert detect(fx(fixture)).profile.name == "jetson-orin-nano"
    for fixture in ("jetson-agx-orin", "jetson-agx-orin-jp5"):
        assert detect(fx(fixture)).profile.name == "jetson-agx-orin"


def _custom(base: DeviceProfile, name: str, *, model: tuple[str, ...] = (), compat: tuple[str, ...] = ()) -> DeviceProfile:
    match = dataclasses.replace(base.match, device_tree_model=model, device_tree_compatible=compat, nv_tegra_release=())
    return dataclasses.replace(base, name=name, match=match, path=None)


@pytest.mark.parametrize(
    ("fixture", "winner", "loser"),
    [
        # both 'Nano' and 'Orin Nano' occur: the longer substring wins
        ("jetson-orin-nano", "board-orin-nano", "board-nano"),
        # only 'Nano' occurs in 'NVIDIA Jetson Nano Developer Kit'
        ("jetson-nano", "board-nano", None),
    ],
)
def test_longest_model_substring_wins(fixture: str, winner: str, loser: str | None) -> None:
    base = load_profile("jetson-nano")
    candidates = [
        _custom(base, "board-nano", model=("nano",)),  # matched case-insensitively
        _custom(base, "board-orin-nano", model=("Orin Nano",)),
        load_profile("generic-aarch64"),
    ]
    det = detect(fx(fixture), profiles=candidates)
    assert det.profile.name == winner
    if loser is not None:
        assert f"more specific than {loser}" in det.reasons


def test_compatible_hits_break_model_ties() -> None:
    base = load_profile("jetson-agx-orin")
    candidates = [
        _custom(base, "agx-a", model=("AGX Orin",)),
        _custom(base, "agx-b", model=("AGX Orin",), compat=("nvidia,p3701-0005",)),
    ]
    assert detect(fx("jetson-agx-orin"), profiles=candidates).profile.name == "agx-b"


def test_detect_errors_for_unknown_or_missing_arch(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="architecture"):
        detect(tmp_path)  # nothing to infer the machine from
    with pytest.raises(ProfileError, match=r"unsupported machine architecture 'riscv64'"):
        detect(tmp_path, machine="riscv64")
    det = detect(tmp_path, machine="arm64")
    assert det.profile.name == "generic-aarch64" and det.fallback
    assert det.memory_budget_mb == det.profile.runtime.memory_budget_mb  # MemTotal unknown: cap only


# --------------------------------------------------------------------------- memory budget


@pytest.mark.parametrize(
    ("cap_mb", "fraction", "mem_total_mb", "expected_mb"),
    [
        (2048, 0.5, 3793, 1896),  # 4 GB Pi 4: the fraction binds
        (2048, 0.5, 8052, 2048),  # 8 GB: the cap binds
        (2048, 0.5, None, 2048),  # MemTotal unknown: cap
        (1536, 0.4, 3964, 1536),  # Jetson Nano numbers
        (4096, 0.25, 1001, 250),  # floor, not round
        (4096, 1.0, 0, 1),  # never below 1 MiB
    ],
)
def test_effective_memory_budget(cap_mb: int, fraction: float, mem_total_mb: int | None, expected_mb: int) -> None:
    runtime = dataclasses.replace(
        load_profile("raspberry-pi-4").runtime, memory_budget_mb=cap_mb, memory_budget_fraction=fraction
    )
    assert effective_memory_budget_mb(runtime, mem_total_mb) == expected_mb


@pytest.mark.parametrize(
    ("fixture", "expected_mb"),
    [
        ("raspberry-pi-4", 1896),  # min(2048, 0.5 * 3793)
        ("raspberry-pi-5", 4026),  # min(4096, 0.5 * 8052)
        ("jetson-nano", 1536),  # min(1536, 0.4 * 3964 = 1585)
        ("jetson-agx-orin", 16384),  # min(16384, 0.5 * 62827)
        ("jetson-orin-nx-16gb", 7808),  # min(8192, 0.5 * 15617)
        ("jetson-orin-nx-8gb", 3809),  # min(4096, 0.5 * 7619)
        ("raspberry-pi-3b-plus", 449),  # min(512, 0.5 * 898)
        ("raspberry-pi-zero-2-w", 214),  # min(256, 0.5 * 428)
        ("x86-64-avx512-vnni", 7960),  # min(8192, 0.5 * 15921)
    ],
)
def test_detection_memory_budget(fixture: str, expected_mb: int) -> None:
    det = detect(fx(fixture))
    assert det.memory_budget_mb == expected_mb
    assert f"memory budget: {expected_mb} MiB" in det.explain()


# --------------------------------------------------------------------------- overrides


def test_override_by_name_keeps_facts() -> None:
    det = resolve_profile("jetson-nano", root=fx("raspberry-pi-5"), env={})
    assert (det.profile.name, det.source, det.fallback) == ("jetson-nano", "override-arg", False)
    assert det.facts.device_tree_model == "Raspberry Pi 5 Model B Rev 1.0"
    assert det.memory_budget_mb == 1536  # Nano cap; 0.4 * 8052 is larger
    assert det.reasons[0] == "profile 'jetson-nano' given by the caller"


@pytest.mark.parametrize("as_type", [str, Path])
def test_override_by_path(tmp_path: Path, as_type: type) -> None:
    custom = tmp_path / "my-board.toml"
    custom.write_text(PI5_TEXT.replace('name = "raspberry-pi-5"', 'name = "my-board"'), encoding="utf-8")
    det = resolve_profile(as_type(custom), root=fx("rockchip-rk3588"), env={})
    assert det.profile.name == "my-board"
    assert det.profile.path == custom
    assert det.source == "override-arg"
    assert str(custom) in det.reasons[0]


def test_override_by_object_and_arch_note() -> None:
    profile = load_profile("generic-x86_64")
    det = resolve_profile(profile, root=fx("raspberry-pi-5"), env={})
    assert det.profile is profile
    assert "note: profile is for x86_64 but this machine is aarch64" in det.reasons


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("raspberry-pi-5", "raspberry-pi-5"),  # a bundled name
        ("  jetson-agx-orin  ", "jetson-agx-orin"),  # surrounding space ignored
        (str(profiles_dir() / "jetson-nano.toml"), "jetson-nano"),  # a path
    ],
)
def test_override_by_env(value: str, expected: str) -> None:
    det = resolve_profile(root=fx("rockchip-rk3588"), env={ENV_VAR: value})
    assert (det.profile.name, det.source, det.fallback) == (expected, "override-env", False)
    assert f"{ENV_VAR}={value.strip()!r}" in det.reasons[0]


def test_env_unknown_name_names_the_variable() -> None:
    with pytest.raises(ProfileError) as info:
        resolve_profile(root=fx("rockchip-rk3588"), env={ENV_VAR: "pi-6"})
    assert ENV_VAR in str(info.value) and "raspberry-pi-5" in str(info.value)


def test_argument_beats_env_and_empty_env_detects() -> None:
    det = resolve_profile("raspberry-pi-4", root=fx("raspberry-pi-5"), env={ENV_VAR: "jetson-nano"})
    assert det.profile.name == "raspberry-pi-4" and det.source == "override-arg"
    det = resolve_profile(root=fx("raspberry-pi-5"), env={ENV_VAR: "   "})
    assert det.profile.name == "raspberry-pi-5" and det.source == "detected"


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "jetson-orin-nano")
    assert resolve_profile(root=fx("raspberry-pi-4")).profile.name == "jetson-orin-nano"
    monkeypatch.delenv(ENV_VAR)
    assert resolve_profile(root=fx("raspberry-pi-4")).profile.name == "raspberry-pi-4"


def test_detection_invariants() -> None:
    det = detect(fx("raspberry-pi-4"))
    with pytest.raises(ProfileError, match="fallback"):
        dataclasses.replace(det, fallback=True)
    with pytest.raises(ProfileError, match="source"):
        dataclasses.replace(det, source="guessed")


# --------------------------------------------------------------------------- profile location


def test_profiles_dir_prefers_packaged_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_module = tmp_path / "site" / "edge_sdk" / "profiles" / "profile.py"
    fake_module.parent.mkdir(parents=True)
    monkeypatch.setattr(profile_module, "__file__", str(fake_module))
    # no edge_sdk/_profiles: the checkout layout <repo>/device_profiles
    assert profiles_dir() == tmp_path / "site" / "device_profiles"
    with pytest.raises(ProfileError, match="no bundled device profiles"):
        list_profiles()
    packaged = fake_module.parents[1] / "_profiles"  # edge_sdk/_profiles in a wheel
    packaged.mkdir()
    (packaged / "raspberry-pi-5.toml").write_text(PI5_TEXT, encoding="utf-8")
    assert profiles_dir() == packaged
    assert list_profiles() == ["raspberry-pi-5"]


def test_checkout_profiles_dir() -> None:
    assert profiles_dir() == Path(profiles.__file__).resolve().parents[2] / "device_profiles"  # edge_sdk/profiles/__init__.py
    assert os.path.isdir(profiles_dir())


def test_a_parsed_profile_is_remembered_until_its_file_changes(tmp_path: Path) -> None:
    """A warm process does not parse an unchanged profile file again (one frozen object is shared);
    a rewrite, even one that puts the old mtime back, changes st_ctime_ns and is parsed again; a file
    changed within the racy window is not remembered."""
    src = (profile_module.profiles_dir() / "raspberry-pi-5.toml").read_text()
    p = tmp_path / "raspberry-pi-5.toml"
    p.write_text(src)
    old = p.stat().st_mtime_ns - 10_000_000_000
    os.utime(p, ns=(old, old))  # mtime 10 s back; ctime is now: still racy
    assert load_profile(p) is not load_profile(p)
    os.utime(p, ns=(old, old))
    profile_module._PARSED.clear()
    window = profile_module._RACY_NS
    profile_module._RACY_NS = 0  # stand-in for waiting 2.5 s
    try:
        a = load_profile(p)
        assert load_profile(p) is a
        p.write_text(src.replace('display_name = "', 'display_name = "Rewritten ', 1))
        os.utime(p, ns=(old, old))  # the same mtime as before; the size and ctime differ
        b = load_profile(p)
        assert b is not a and b.display_name.startswith("Rewritten ") and not a.display_name.startswith("Rewritten ")
    finally:
        profile_module._RACY_NS = window
