#!/usr/bin/env bash
# Install proof: install edge_sdk from this working tree with pip and run tools/smoke_test.py
#   * in an emulated Debian 12 (bookworm, the base of Raspberry Pi OS) arm64 root
#     (debootstrap + qemu-user-static; Python 3.11, the board's own), or
#   * under an x86_64 CPython 3.10 in a fresh venv (JetPack 6's Python version), or
#   * by resolving the aarch64 cp310 wheel of every runtime dependency of edge-sdk[all].
# Slow (~10 min with a fresh root: debootstrap ~3 min, pip install under qemu ~2 min, the checks
# per emulated core ~0.5 min, ~2 min more with --pytest), so CI does not run it:
# docs/install-proof.md holds a passing run's output; tests/test_install_proof.py runs the smoke test.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/arm64_install_proof.sh [--python FLAVOUR | --wheels-3.10-arm64] [--root DIR] [--rebuild]
                                    [--cpu LIST] [--keep] [--log-dir DIR] [--pytest "TESTS..."] [-h]

Install edge_sdk from this working tree (git ls-files, tracked and untracked-not-ignored,
copied: the tree itself is never written) with pip, as `.[all]`, and run tools/smoke_test.py
(versions, profile detection, load + predict on ONNX and TFLite, edge-convert quantize).

  --python 3.11-arm64    (default) Debian 12 bookworm arm64 root built with debootstrap
                         --arch=arm64 --variant=minbase, run through qemu-user-static/binfmt_misc
                         (needs root; installs debootstrap qemu-user-static binfmt-support with apt-get)
  --python 3.10-x86_64   a fresh venv of an x86_64 CPython 3.10 ($EDGE_SDK_PY310, else python3.10 on
                         PATH, else ~/.pyenv/versions/3.10.*): compileall + import every module + smoke test
  --python wheels-3.10-arm64, --wheels-3.10-arm64
                         pip download --only-binary=:all: of every runtime dependency of edge-sdk[all]
                         for CPython 3.10 on manylinux aarch64 (glibc <= 2.35, JetPack 6 / Ubuntu 22.04)
  --root DIR             where the arm64 root (or the 3.10 work folders) live; reused when valid
                         (default $EDGE_SDK_ARM64_ROOT, else /var/tmp/edge_sdk-arm64/bookworm-arm64)
  --rebuild              build the root again even if a valid one is there
  --cpu LIST             3.11-arm64: the emulated cores to run the checks on, one install
                         (default cortex-a76,cortex-a72: Raspberry Pi 5 and 4; also cortex-a57 =
                         Jetson Nano, neoverse-n1, max = qemu's every-feature CPU). Each gets
                         QEMU_CPU=<model> and, where qemu shows the host's x86 /proc/cpuinfo, a
                         stand-in /proc/cpuinfo of that core bound over it
  --keep                 keep the venv, source copy and smoke-test scratch in the root afterwards
                         (default: removed; the root itself and pip's cache are always kept)
  --log-dir DIR          full log here as <flavour>.log (default $EDGE_SDK_PROOF_LOGS, else /tmp/arm64-proof)
  --pytest "TESTS..."    also run these test files of the copied tree with pytest inside (3.11-arm64)

Environment: EDGE_SDK_DEBIAN_MIRROR (default: the first Debian URI apt uses here, else
http://deb.debian.org/debian), EDGE_SDK_PY310, PIP_INDEX_URL / PIP_EXTRA_INDEX_URL (http(s) only)
and http(s)_proxy are passed into the root; the host's CA bundle is copied in for pip.
Exit status: 0 when every check passed, non-zero otherwise.
EOF
}

FLAVOUR=3.11-arm64
ROOT=${EDGE_SDK_ARM64_ROOT:-}
LOG_DIR=${EDGE_SDK_PROOF_LOGS:-/tmp/arm64-proof}
KEEP=0
REBUILD=0
PYTESTS=""
CPUS=cortex-a76,cortex-a72
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --python) [ $# -ge 2 ] || { echo "--python needs a value: 3.11-arm64, 3.10-x86_64 or wheels-3.10-arm64" >&2; exit 2; }
              FLAVOUR=$2; shift ;;
    --python=*) FLAVOUR=${1#*=} ;;
    --wheels-3.10-arm64) FLAVOUR=wheels-3.10-arm64 ;;
    --root) [ $# -ge 2 ] || { echo "--root needs a directory" >&2; exit 2; }; ROOT=$2; shift ;;
    --root=*) ROOT=${1#*=} ;;
    --log-dir) [ $# -ge 2 ] || { echo "--log-dir needs a directory" >&2; exit 2; }; LOG_DIR=$2; shift ;;
    --log-dir=*) LOG_DIR=${1#*=} ;;
    --pytest) [ $# -ge 2 ] || { echo "--pytest needs test paths" >&2; exit 2; }; PYTESTS=$2; shift ;;
    --cpu) [ $# -ge 2 ] || { echo "--cpu needs a comma list of qemu CPU models" >&2; exit 2; }; CPUS=$2; shift ;;
    --cpu=*) CPUS=${1#*=} ;;
    --keep) KEEP=1 ;;
    --rebuild) REBUILD=1 ;;
    *) echo "unknown argument: $1 (expected --python 3.11-arm64|3.10-x86_64|wheels-3.10-arm64, --wheels-3.10-arm64, --root DIR, --rebuild, --cpu LIST, --keep, --log-dir DIR, --pytest TESTS; see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$FLAVOUR" in
  3.11-arm64|3.10-x86_64|wheels-3.10-arm64) ;;
  *) echo "--python: expected 3.11-arm64, 3.10-x86_64 or wheels-3.10-arm64, got '$FLAVOUR'" >&2; exit 2 ;;
esac
for c in ${CPUS//,/ }; do
  case "$c" in
    cortex-a76|cortex-a72|cortex-a57|neoverse-n1|max) ;;
    *) echo "--cpu: expected a comma list of cortex-a76, cortex-a72, cortex-a57, neoverse-n1, max; got '$c'" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=${ROOT:-/var/tmp/edge_sdk-arm64/bookworm-arm64}
case "$ROOT" in /*) ;; *) ROOT=$(pwd)/$ROOT ;; esac
ROOT=${ROOT%/}
[ "$ROOT" != "" ] && [ "$ROOT" != "/" ] || { echo "--root must not be /" >&2; exit 2; }
BASE=$(dirname "$ROOT")
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/$FLAVOUR.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
T0=$SECONDS
step() { printf '\n=== [%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { echo "arm64_install_proof: $*" >&2; exit 1; }
step "edge_sdk install proof: $FLAVOUR ($(date -u +%FT%TZ)); tree $REPO; log $LOG"

# ------------------------------------------------------------------ helpers

# Copy the working tree (tracked + untracked-not-ignored files) to $1, fresh.
copy_tree() {
  local dest=$1
  rm -rf "$dest"
  mkdir -p "$dest"
  if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
      | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
      | tar --null -T - -cf -) | tar -xf - -C "$dest"
    echo "copied $(cd "$dest" && find . -type f | wc -l) files of $REPO ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') + working tree changes) to $dest"
  else
    (cd "$REPO" && tar --exclude=.git --exclude=__pycache__ --exclude='.venv*' -cf - .) | tar -xf - -C "$dest"
    echo "copied $REPO (no git) to $dest"
  fi
}

# The import check for a Python: every module of edge_sdk and converters imports.
IMPORT_ALL='
import importlib, pkgutil, sys
bad = []
n = 0
for top in ("edge_sdk", "converters"):
    pkg = importlib.import_module(top)
    for m in pkgutil.walk_packages(pkg.__path__, top + "."):
        n += 1
        try:
            importlib.import_module(m.name)
        except Exception as e:
            bad.append(f"{m.name}: {type(e).__name__}: {e}")
print(f"imported {n} modules of edge_sdk + converters under Python {sys.version.split()[0]}; failures: {len(bad)}")
for b in bad:
    print("  IMPORT FAIL", b)
sys.exit(1 if bad else 0)
'

# ------------------------------------------------------------------ 3.10 x86_64

run_py310_x86_64() {
  local py
  py=$(find_py310) || die "no working Python 3.10 found: set EDGE_SDK_PY310=/path/to/python3.10"
  local work="$BASE/py310-x86_64"
  step "Python: $py ($("$py" -c 'import platform,sys; print(platform.python_version(), platform.machine(), sys.implementation.name)'))"
  copy_tree "$work/src"
  step "compileall under $("$py" -V): edge_sdk converters tools tests samples (syntax this Python lacks fails here)"
  (cd "$work/src" && "$py" -m compileall -q -f edge_sdk converters tools tests samples >/dev/null) && echo "compileall: OK"
  find "$work/src" -name __pycache__ -type d -prune -exec rm -rf {} +
  step "fresh venv + pip install '.[all]' pytest"
  rm -rf "$work/venv"
  "$py" -m venv "$work/venv"
  "$work/venv/bin/python" -m pip --version
  "$work/venv/bin/python" -m pip config list || true
  "$work/venv/bin/python" -m pip install -q "$work/src[all]" pytest
  "$work/venv/bin/python" -m pip list --format=freeze | grep -iE '^(edge-sdk|numpy|onnxruntime|ai-edge-litert|onnx|opencv-python-headless|tomli|psutil|cryptography|starlette|uvicorn)=='
  step "import every module (from the installed wheel, cwd outside the tree)"
  (cd "$work" && "$work/venv/bin/python" -c "import edge_sdk, sys; assert 'site-packages' in edge_sdk.__file__, edge_sdk.__file__; print('edge_sdk from', edge_sdk.__file__)" \
    && "$work/venv/bin/python" -c "$IMPORT_ALL")
  step "smoke test"
  rm -rf "$work/smoke"
  (cd "$work" && PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" "$work/src/tools/smoke_test.py" --json "$LOG_DIR/$FLAVOUR.json" --work "$work/smoke")
  if [ "$KEEP" != 1 ]; then rm -rf "$work/venv" "$work/smoke" "$work/src"; fi
}

# ------------------------------------------------------------------ wheels 3.10 aarch64

find_py310() {  # the first candidate that runs and is 3.10 (a pyenv shim on PATH may exist and not run)
  local cand
  for cand in ${EDGE_SDK_PY310:-} $(command -v python3.10 || true) $(ls -d "$HOME"/.pyenv/versions/3.10.*/bin/python3.10 2>/dev/null || true); do
    if "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' >/dev/null 2>&1; then echo "$cand"; return 0; fi
  done
  return 1
}

run_wheels_310_arm64() {
  local work="$BASE/wheels-3.10-arm64"
  rm -rf "$work/wheelhouse" "$work/sdk"
  mkdir -p "$work/wheelhouse" "$work/sdk"
  copy_tree "$work/src"
  # pip evaluates environment markers (python_version < '3.11' for tomli) against the Python it runs
  # under, not --python-version: run it under a 3.10 when there is one. The audit below re-evaluates
  # every marker for CPython 3.10 on Linux aarch64 either way.
  local pip_py
  pip_py=$(find_py310 || command -v python3)
  step "build edge_sdk's own wheel (pure Python: py3-none-any) with $pip_py"
  "$pip_py" -m pip wheel -q --no-deps -w "$work/sdk" "$work/src"
  local whl
  whl=$(ls "$work/sdk"/edge_sdk-*.whl)
  basename "$whl"
  step "resolve every runtime dependency of edge-sdk[all] for CPython 3.10 on manylinux aarch64, binary wheels only"
  # Every manylinux tag a glibc 2.35 system (Ubuntu 22.04 / JetPack 6) accepts, spelled out:
  # not every pip expands manylinux_2_35 to the older tags itself.
  local plats=(--platform manylinux2014_aarch64) g
  for g in $(seq 17 35); do plats+=(--platform "manylinux_2_${g}_aarch64"); done
  echo "$("$pip_py" -m pip --version | cut -d' ' -f1-2) under $("$pip_py" -V); platforms manylinux2014 + manylinux_2_17..2_35 aarch64"
  "$pip_py" -m pip download --only-binary=:all: --no-cache-dir "${plats[@]}" \
    --python-version 3.10 --implementation cp --abi cp310 \
    -d "$work/wheelhouse" "$whl[all]" 2>&1 | grep -vE '^WARNING: Location .* is ignored|━|^\s*(Downloading|File was already)'
  step "audit: tags, Requires-Python and the dependency closure, markers evaluated for CPython 3.10 / Linux aarch64"
  "$pip_py" - "$work/wheelhouse" <<'EOF'
import re, sys, zipfile
from email.parser import Parser
from pathlib import Path
try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # pip's vendored copy
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet

TARGET = {"python_version": "3.10", "python_full_version": "3.10.12", "platform_machine": "aarch64",
          "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython",
          "implementation_version": "3.10.12", "platform_release": "", "platform_version": ""}
canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
wheels, bad = {}, []
for w in sorted(Path(sys.argv[1]).iterdir()):
    if w.suffix != ".whl":
        bad.append(f"{w.name}: not a wheel (an sdist would need a compiler)"); continue
    name, ver, *_, py, abi, plat = w.stem.split("-")
    z = zipfile.ZipFile(w)
    meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    wheels[canon(name)] = (w.name, ver, meta)
    pys, plats = py.split("."), plat.split(".")
    ok_py = any(p in ("py3", "py2.py3") or p == "cp310" or (abi == "abi3" and p.startswith("cp3") and int(p[3:]) <= 10) for p in pys)
    glibc = [tuple(map(int, m.groups())) for p in plats for m in [re.match(r"manylinux_(\d+)_(\d+)_aarch64$", p)] if m]
    glibc += [(2, 17) for p in plats if p == "manylinux2014_aarch64"]
    ok_plat = plat == "any" or bool(glibc and min(glibc) <= (2, 35))
    rp = meta.get("Requires-Python")
    ok_rp = not rp or SpecifierSet(rp).contains("3.10.12")
    print(f"  {name:24s} {ver:10s} {py}-{abi}-{plat}" + (f"  (Requires-Python {rp})" if rp else ""))
    if not (ok_py and ok_plat and ok_rp):
        bad.append(f"{w.name}: python tag ok {ok_py}, aarch64 glibc<=2.35 ok {ok_plat}, Requires-Python ok {ok_rp}")
# Closure: from edge-sdk[all], every requirement whose marker holds on the target must be present.
todo, seen, needed = [("edge-sdk", frozenset({"all"}))], set(), set()
while todo:
    name, extras = todo.pop()
    if (name, extras) in seen:
        continue
    seen.add((name, extras))
    if name not in wheels:
        bad.append(f"{name}: required but no wheel resolved"); continue
    for line in wheels[name][2].get_all("Requires-Dist") or []:
        req = Requirement(line)
        envs = [dict(TARGET, extra=e) for e in (extras or {""})] if req.marker else [TARGET]
        if req.marker and not any(req.marker.evaluate(env) for env in envs):
            continue
        dep = canon(req.name)
        needed.add(dep)
        if dep in wheels and not req.specifier.contains(wheels[dep][1], prereleases=True):
            bad.append(f"{name} needs {req}, resolved {wheels[dep][1]}")
        todo.append((dep, frozenset(req.extras)))
direct = sorted({canon(Requirement(r).name) for r in wheels["edge-sdk"][2].get_all("Requires-Dist")
                 if not Requirement(r).marker or Requirement(r).marker.evaluate(dict(TARGET, extra="all"))})
native = [n for n, (f, _, _) in wheels.items() if not f.endswith("-any.whl")]
print(f"{len(wheels)} wheels ({len(native)} with aarch64 native code); edge-sdk[all] on CPython 3.10 aarch64 needs directly: {', '.join(direct)}")
print(f"closure: {len(needed)} distributions required, all resolved as wheels: {not [b for b in bad if 'no wheel' in b]}")
extra_wheels = sorted(set(wheels) - needed - {"edge-sdk"})
if extra_wheels:
    print(f"  resolved but not required on the target (host markers): {', '.join(extra_wheels)}")
for b in bad:
    print("  PROBLEM", b)
print("AUDIT", "PASSED" if not bad else "FAILED")
sys.exit(1 if bad else 0)
EOF
  cat <<'EOF'
What this proves: pip's resolver, restricted to binary wheels for CPython 3.10 (cp310 ABI) on
manylinux aarch64 with glibc <= 2.35 (JetPack 6 = Ubuntu 22.04 = glibc 2.35), finds a wheel for
every runtime dependency of edge-sdk[all], tomli included (Python 3.10 has no tomllib), and the
audit re-checks tags, Requires-Python and the whole dependency closure with the markers evaluated
for CPython 3.10 on Linux aarch64: `pip install edge-sdk[all]` there needs no compiler.
What it does not prove: that those aarch64 cp310 wheels import and run. No aarch64 Python 3.10
could be run here (no Debian release ships one; python.org is unreachable), so no cp310 aarch64
binary was executed. The code itself is shown 3.10-clean by the 3.10-x86_64 run (compileall,
import of every module, smoke test) and arm64-clean by the 3.11-arm64 run.
EOF
  if [ "$KEEP" != 1 ]; then rm -rf "$work/src" "$work/sdk"; fi
}

# ------------------------------------------------------------------ 3.11 arm64 (Debian bookworm)

MOUNTS=()
cleanup() {
  local rc=$?
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || echo "WARNING: could not unmount ${MOUNTS[i]}" >&2
  done
  MOUNTS=()
  if [ "$FLAVOUR" = 3.11-arm64 ] && [ -n "${ROOT:-}" ] && [ -d "$ROOT" ] && [ "$KEEP" != 1 ]; then
    rm -rf "$ROOT/src" "$ROOT/opt/edge-sdk-venv" "$ROOT/tmp/edge-sdk-smoke" "$ROOT"/tmp/smoke-*.json "$ROOT/tmp/pytest-of-root" "$ROOT/run-proof.sh"
  fi
  if [ $rc -eq 0 ]; then step "PASSED ($FLAVOUR) in $((SECONDS - T0)) s"; else step "FAILED ($FLAVOUR, exit $rc) after $((SECONDS - T0)) s; log $LOG"; fi
  exit $rc
}

mount_in() {  # mount_in TARGET ARGS... : mount, remember for cleanup
  local target=$1; shift
  mkdir -p "$target"
  if findmnt -rn --mountpoint "$target" >/dev/null 2>&1; then
    die "$target is already mounted (another run, or a leftover: umount it first)"
  fi
  mount "$@" "$target"
  MOUNTS+=("$target")
}

debian_mirror() {
  if [ -n "${EDGE_SDK_DEBIAN_MIRROR:-}" ]; then echo "$EDGE_SDK_DEBIAN_MIRROR"; return; fi
  local m
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n' | grep -E '/debian/?$' | head -1 || true)
  [ -n "$m" ] || m=$(grep -hE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
  echo "${m:-http://deb.debian.org/debian}"
}

root_ok() {
  [ -f "$ROOT/.edge-sdk-arm64-root" ] && [ -x "$ROOT/usr/bin/python3" ] \
    && [ "$(chroot "$ROOT" /usr/bin/python3 -c 'import platform; print(platform.machine())' 2>/dev/null)" = aarch64 ]
}

run_311_arm64() {
  [ "$(id -u)" = 0 ] || die "the arm64 root needs root (debootstrap, mount, chroot): run with sudo"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  step "host: $(uname -srm); $(. /etc/os-release && echo "$PRETTY_NAME")"
  local need=()
  command -v debootstrap >/dev/null || need+=(debootstrap)
  [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || [ -x /usr/bin/qemu-aarch64-static ] || need+=(qemu-user-static)
  command -v update-binfmts >/dev/null || need+=(binfmt-support)
  if [ ${#need[@]} -gt 0 ]; then
    step "apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  fi
  echo "debootstrap $(dpkg-query -W -f='${Version}' debootstrap); qemu-user-static $(dpkg-query -W -f='${Version}' qemu-user-static)"
  if ! findmnt -rn -t binfmt_misc >/dev/null 2>&1; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 || true
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --import qemu-aarch64 || true
  grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null || die "qemu-aarch64 is not registered in binfmt_misc"
  echo "binfmt_misc: qemu-aarch64 $(sed -n 's/^interpreter //p' /proc/sys/fs/binfmt_misc/qemu-aarch64), flags $(sed -n 's/^flags: //p' /proc/sys/fs/binfmt_misc/qemu-aarch64)"

  if findmnt -rn -o TARGET | grep -q "^$ROOT/"; then
    die "something is still mounted under $ROOT (a killed run?): umount it first"
  fi
  if [ "$REBUILD" = 1 ] || ! root_ok; then
    if [ -e "$ROOT" ]; then
      if [ -f "$ROOT/.edge-sdk-arm64-root" ] || [ -f "$ROOT/.edge-sdk-arm64-building" ] || [ -d "$ROOT/debootstrap" ] || [ -z "$(ls -A "$ROOT")" ]; then
        echo "removing the old or unfinished root $ROOT"
        rm -rf --one-file-system "$ROOT"
      else
        die "$ROOT exists and is not a root this script built: remove it or pass another --root"
      fi
    fi
    local mirror
    mirror=$(debian_mirror)
    step "debootstrap --arch=arm64 --variant=minbase bookworm $ROOT $mirror"
    mkdir -p "$ROOT"
    touch "$ROOT/.edge-sdk-arm64-building"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$ROOT" "$mirror"
    rm -f "$ROOT/.edge-sdk-arm64-building"
    echo "bookworm arm64 $mirror $(date -u +%FT%TZ)" >"$ROOT/.edge-sdk-arm64-root"
    root_ok || die "the new root does not run aarch64 python3"
  else
    step "reusing the root $ROOT (built $(cut -d' ' -f4 "$ROOT/.edge-sdk-arm64-root"); --rebuild to build it again)"
  fi
  echo "root: Debian $(cat "$ROOT/etc/debian_version"), $(chroot "$ROOT" /usr/bin/python3 -c 'import platform,sys; print("Python", platform.python_version(), platform.machine(), "glibc", platform.libc_ver()[1])')"

  step "copy the tree, host CA bundle, resolv.conf; mount /proc /sys /dev"
  copy_tree "$ROOT/src"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
  local host_ca=/etc/ssl/certs/ca-certificates.crt
  [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ] && host_ca=$PIP_CERT
  cp "$host_ca" "$ROOT/etc/ssl/certs/host-ca-bundle.crt"
  mount_in "$ROOT/proc" -t proc proc
  mount_in "$ROOT/sys" -t sysfs sysfs
  mount_in "$ROOT/dev" --bind /dev
  mount --make-private "$ROOT/dev"
  mount_in "$ROOT/dev/shm" -t tmpfs -o mode=1777,size=512m tmpfs
  # qemu-user 7.2 (Debian 12) passes the host's x86 /proc/cpuinfo through to aarch64 programs: the
  # cpuinfo library inside onnxruntime's aarch64 build dereferences NULL on it (SIGSEGV at
  # `import onnxruntime`), and XNNPACK takes the core's features from it. A board's /proc/cpuinfo
  # lists its Arm cores, so bind a stand-in of the board's over it (one block per host CPU, as
  # /sys/devices/system/cpu says) and emulate the same core (QEMU_CPU), not qemu's `max` CPU.
  local host_cpuinfo_arm=0
  chroot "$ROOT" /bin/grep -q '^CPU implementer' /proc/cpuinfo && host_cpuinfo_arm=1
  local pass_env=(HOME=/root LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
                  PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180
                  PYTHONDONTWRITEBYTECODE=1 PYTESTS="$PYTESTS")
  local v
  for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL http_proxy https_proxy HTTP_PROXY HTTPS_PROXY no_proxy NO_PROXY; do
    if [ -n "${!v:-}" ] && [[ "$v" != PIP_* || "${!v}" == http* ]]; then pass_env+=("$v=${!v}"); fi
  done
  cat >"$ROOT/run-proof.sh" <<'EOF'
set -euo pipefail
T0=$SECONDS
say() { printf '\n--- [%4ds inside] %s\n' "$((SECONDS - T0))" "$*"; }
V=/opt/edge-sdk-venv/bin
say "$(uname -m); $(. /etc/os-release && echo "$PRETTY_NAME"); $(python3 -V); QEMU_CPU=${QEMU_CPU:-max}; /proc/cpuinfo: $(grep -c '^processor' /proc/cpuinfo) x CPU part $(sed -n 's/^CPU part\t: //p' /proc/cpuinfo | head -1)"
if [ "$1" = install ]; then
  rm -rf /opt/edge-sdk-venv
  python3 -m venv /opt/edge-sdk-venv
  $V/python -m pip --version
  say "pip install '/src[all]' pytest (wheels for aarch64 from PyPI)"
  $V/python -m pip install --progress-bar off "/src[all]" pytest 2>&1 | { grep -vE '^\s*(Using cached|Downloading|Collecting|Requirement already)' || true; }
  $V/python -m pip list --format=freeze | grep -iE '^(edge-sdk|numpy|onnxruntime|ai-edge-litert|onnx|onnx-ir|opencv-python-headless|pillow|matplotlib|psutil|cryptography|starlette|uvicorn|pytest)=='
  say "import every module (from the installed wheel, cwd outside the tree)"
  cd /tmp
  $V/python -c "import edge_sdk; assert '/opt/edge-sdk-venv/' in edge_sdk.__file__, edge_sdk.__file__; print('edge_sdk from', edge_sdk.__file__)"
  $V/python -c "$IMPORT_ALL"
  exit 0
fi
cd /tmp
say "edge-sdk profile"
$V/edge-sdk profile | head -12
say "smoke test"
rm -rf /tmp/edge-sdk-smoke
PATH=$V:$PATH $V/python /src/tools/smoke_test.py --json "/tmp/smoke-$2.json" --work /tmp/edge-sdk-smoke
if [ -n "$PYTESTS" ]; then
  say "pytest $PYTESTS (the tree's tests, against the tree's code, on this venv's runtimes)"
  cd /src && $V/python -m pytest -q -p no:cacheprovider $PYTESTS
fi
EOF
  local cpu first=1
  IFS=, read -r -a cpus <<<"$CPUS"
  for cpu in "${cpus[@]}"; do
    if [ "$host_cpuinfo_arm" = 0 ] && [ "$cpu" != max ]; then
      local cpuinfo="$BASE/cpuinfo-$cpu.txt"
      standin_cpuinfo "$cpu" >"$cpuinfo"
      mount --bind "$cpuinfo" "$ROOT/proc/cpuinfo"
      MOUNTS+=("$ROOT/proc/cpuinfo")
      echo "NOTE: qemu shows aarch64 programs the host's x86 /proc/cpuinfo; bound a $cpu stand-in over it ($cpuinfo)"
    elif [ "$host_cpuinfo_arm" = 0 ]; then
      echo "NOTE: --cpu max: qemu's all-features CPU, host's x86 /proc/cpuinfo left as it is (onnxruntime will not import)"
    fi
    if [ "$first" = 1 ]; then
      step "chroot $ROOT, QEMU_CPU=$cpu: fresh venv, pip install, import (emulated aarch64: slow)"
      chroot "$ROOT" /usr/bin/env -i "${pass_env[@]}" QEMU_CPU="$cpu" IMPORT_ALL="$IMPORT_ALL" /bin/bash /run-proof.sh install
      first=0
    fi
    step "chroot $ROOT, QEMU_CPU=$cpu: edge-sdk profile, smoke test${PYTESTS:+, pytest}"
    chroot "$ROOT" /usr/bin/env -i "${pass_env[@]}" QEMU_CPU="$cpu" IMPORT_ALL="$IMPORT_ALL" /bin/bash /run-proof.sh check "$cpu"
    cp "$ROOT/tmp/smoke-$cpu.json" "$LOG_DIR/$FLAVOUR-$cpu.json" 2>/dev/null || true
    if [ "${MOUNTS[${#MOUNTS[@]}-1]}" = "$ROOT/proc/cpuinfo" ]; then
      umount "$ROOT/proc/cpuinfo"
      unset 'MOUNTS[${#MOUNTS[@]}-1]'
    fi
  done
}

# A /proc/cpuinfo of the board with this core (Features as the boards' kernels list them; one
# block per host CPU, as /sys/devices/system/cpu says, so the two agree).
standin_cpuinfo() {
  local features variant part revision n i
  case "$1" in
    cortex-a76)  # Raspberry Pi 5 (BCM2712)
      features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
      variant=0x4 part=0xd0b revision=1 ;;
    cortex-a72)  # Raspberry Pi 4 (BCM2711)
      features="fp asimd evtstrm crc32 cpuid"
      variant=0x0 part=0xd08 revision=3 ;;
    cortex-a57)  # Jetson Nano (Tegra X1)
      features="fp asimd evtstrm aes pmull sha1 sha2 crc32"
      variant=0x1 part=0xd07 revision=1 ;;
    neoverse-n1)  # the Cortex-A76's server sibling
      features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"
      variant=0x3 part=0xd0c revision=1 ;;
    *) die "--cpu $1: no stand-in /proc/cpuinfo for it (cortex-a76, cortex-a72, cortex-a57, neoverse-n1, max)" ;;
  esac
  n=$(getconf _NPROCESSORS_CONF)
  for ((i = 0; i < n; i++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %s\n\n' \
      "$i" "$features" "$variant" "$part" "$revision"
  done
}

case "$FLAVOUR" in
  3.11-arm64) run_311_arm64 ;;
  3.10-x86_64) trap cleanup EXIT; run_py310_x86_64 ;;
  wheels-3.10-arm64) trap cleanup EXIT; run_wheels_310_arm64 ;;
esac
