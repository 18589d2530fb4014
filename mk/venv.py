"""The make layer's helper (docs/MAKE.md): standard library only, because it runs before the venv
exists (under python3) and inside interpreters this project did not build (PYTHON=).

    python3 mk/venv.py unknown GOALS KNOWN GLOBALS NAME=TARGETS...   refuse mistyped variables
    python3 mk/venv.py setup --venv DIR [--python PY] ...    create or check the environment
    PY mk/venv.py check [--external] ...          inside PY: does it meet the requirements?
    PY mk/venv.py gpu WHY DRIVER                  inside PY: does torch see the GPUs?

`setup` calls pip only when the environment misses what pyproject.toml (and the Makefile's pins)
declare, never on a file's date: an offline node whose venv imports the project runs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROJECT_PACKAGES = ("common", "model", "experiments", "sweeps", "pipelines", "analysis")


# ---------------------------------------------------------------- mistyped make variables
def distance(a: str, b: str) -> int:
    """Levenshtein distance."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def closest(name: str, known: list[str]) -> str | None:
    """The known name nearest to `name` (case ignored: `kappa` is KAPPA), if it is near enough to
    be a typo: at most one edit in three characters."""
    scored = sorted((distance(name.upper(), k.upper()), k) for k in known)
    if scored and scored[0][0] <= max(1, len(name) // 3):
        return scored[0][1]
    return None


def unknown(goals: str, known: list[str], names: dict[str, list[str]], glob: list[str]) -> str:
    """One line for the command-line variables that no target in the goal list takes: the
    nearest known name, else the targets that do take it and what these goals take."""
    where = f"make {goals}"
    parts, listed = [], False
    for name, takers in names.items():
        if name.startswith("FTBENCH_"):
            parts.append(f"{name}: an environment setting, not a make variable; put it before "
                         f"make: {name}=... {where}")
            continue
        near = closest(name, known)
        if near:
            parts.append(f"{name}: unknown variable for {where}; did you mean {near}?")
            continue
        other = [f"make {t}" for t in takers if t not in goals.split()][:4]
        also = f"; {', '.join(other)} take{'s' * (len(other) == 1)} it" if other else ""
        parts.append(f"{name}: unknown variable for {where}{also}")
        listed = True
    own = sorted(set(known) - set(glob))  # the globals are in docs/MAKE.md and `make help`
    takes = f"; {where} takes: {' '.join(own) or 'none'}" if listed else ""
    return "; ".join(parts) + takes


# ---------------------------------------------------------------- the declared requirements
def _toml(path: Path) -> dict | None:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:
        try:
            from pip._vendor import tomli as tomllib  # 3.10: pip carries a parser
        except ModuleNotFoundError:
            return None
    return tomllib.loads(path.read_text(encoding="utf-8"))


def declared(pyproject: Path, extras: list[str]) -> list[str] | None:
    """pyproject's dependencies and the named extras, as requirement strings (None: no parser)."""
    doc = _toml(pyproject)
    if doc is None:
        return None
    proj = doc["project"]
    opt = proj.get("optional-dependencies", {})
    return [*proj.get("dependencies", []), *(r for e in extras for r in opt.get(e, []))]


def requirements_hash(pyproject: Path, extras: list[str], pins: list[str]) -> str:
    """What the stamp records: the declared requirements (comments and other settings do not
    count; without a TOML parser, the whole file does)."""
    reqs = declared(pyproject, extras)
    text = json.dumps(reqs) if reqs is not None else pyproject.read_text(encoding="utf-8")
    return hashlib.sha256("\n".join([text, *pins]).encode()).hexdigest()[:16]


def _packaging():
    try:
        from packaging.requirements import Requirement
    except ModuleNotFoundError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def unmet(reqs: list[str]) -> list[str]:
    """The requirements this interpreter does not meet, from the installed metadata (no import,
    no network)."""
    import importlib.metadata as md

    Requirement = _packaging()
    out = []
    for text in reqs:
        r = Requirement(text)
        if r.marker is not None and not r.marker.evaluate():
            continue
        try:
            have = md.version(r.name)
        except md.PackageNotFoundError:
            out.append(f"{r.name} (not installed)")
            continue
        if r.specifier and not r.specifier.contains(have, prereleases=True):
            out.append(f"{r.name}{r.specifier} (have {have})")
    return out


def check(a: argparse.Namespace) -> int:
    """Inside the interpreter to run: 0 when it meets the requirements and imports the project;
    else 1 and one line naming what is missing."""
    pyproject = ROOT / "pyproject.toml" if a.pyproject is None else Path(a.pyproject)
    if a.external:  # someone else's environment: torch plus what the offline bundle carries
        def key(req: str) -> str:  # lm_eval and lm-eval are one distribution
            return re.sub(r"[-_.]+", "-", _packaging()(req).name).lower()

        ours = {key(r): r for r in declared(pyproject, []) or []}
        # pyproject's constraint where it has one, else presence (the node may carry its own)
        reqs = [ours.get(key(p), _packaging()(p).name) for p in ["torch", *a.bundle]]
        modules = ["torch"]
    else:
        reqs = [*(declared(pyproject, a.extras) or []), *a.pins, "freetransformer-bench"]
        modules = ["torch", *PROJECT_PACKAGES]
    missing = unmet(reqs)
    if not missing:
        sys.path.insert(0, str(ROOT))
        for m in modules:
            try:
                importlib.import_module(m)
            except Exception as e:  # noqa: BLE001 - any failure means: reinstall
                missing.append(f"import {m} fails ({type(e).__name__}: {str(e)[:120]})")
                break
    if missing:
        print(", ".join(missing))
        return 1
    return 0


# ---------------------------------------------------------------- GPUs
# the one rule of which hosts have GPUs, shared with training and evaluation (standard library)
sys.path.insert(0, str(ROOT))
from common.gpus import driver, gpus_expected, torch_sees_none  # noqa: E402


def gpu(why: str, drv: str, external: bool) -> int:
    """Inside the interpreter to run: torch must see at least one GPU."""
    line = torch_sees_none(why, drv)
    if line is None:
        return 0
    fix = ("check the NVIDIA driver (nvidia-smi)" if drv.startswith("no ") else
           "run with a python whose torch matches the driver" if external else
           "install a torch built for this driver, e.g. make clean setup "
           "TORCH_INDEX=https://download.pytorch.org/whl/cu126")
    print(f"setup: {line}; {fix} (docs/MAKE.md)", file=sys.stderr)
    return 2


# ---------------------------------------------------------------- setup
def _run(cmd: list[str]) -> int:
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


def _ask(py: str, *args: str, capture: bool = True) -> subprocess.CompletedProcess:
    """Run this helper inside the interpreter `py`."""
    return subprocess.run([py, str(HERE / "venv.py"), *args], cwd=ROOT, capture_output=capture,
                          text=True, check=False)


def system_tools(tools: list[str], apt: bool) -> None:
    """Install the missing system tools with apt when root (only on the install path: the node may
    be offline), then name each one still missing."""
    missing = sorted({t.split(":")[1] for t in tools if not shutil.which(t.split(":")[0])})
    if missing and apt and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"setup: installing {' '.join(missing)} (apt)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        ok = subprocess.run(["apt-get", "update", "-qq"], env=env, check=False).returncode == 0
        ok = ok and subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env,
                                   stdout=subprocess.DEVNULL, check=False).returncode == 0
        if not ok:
            print("setup: apt-get install failed")
    for t in tools:
        exe, pkg = t.split(":")
        if not shutil.which(exe):
            print(f"setup: MISSING {exe} (Debian package {pkg}): install it as root, e.g. "
                  f"apt-get install {pkg}")


def torch_build_differs(py: str, index: str) -> bool:
    """Whether the installed torch is another build than TORCH_INDEX serves: its version's local
    tag (2.13.0+cu126) against the index's last path component (.../whl/cu126)."""
    tag = index.rstrip("/").rsplit("/", 1)[-1]
    if not re.fullmatch(r"cpu|cu\d+|rocm[\d.]+", tag):
        return False  # a mirror whose build we cannot tell from its address
    ver = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return ver.partition("+")[2] != tag


def external(a: argparse.Namespace, pyproject: Path) -> int:
    """PYTHON=: an environment we did not build is checked, never installed into."""
    py = shutil.which(a.python) or a.python
    if not os.access(py, os.X_OK):
        print(f"PYTHON={a.python}: not an executable python", file=sys.stderr)
        return 2
    r = _ask(py, "check", "--external", "--pyproject", str(pyproject), "--bundle", *a.bundle)
    if r.returncode:
        what = r.stdout.strip() or r.stderr.strip()[-300:]
        fix = ("PYTHON= is for an environment that holds torch" if what.startswith("torch")
               else "carry them in with make offline-bundle")
        print(f"setup: PYTHON={a.python} lacks {what}; {fix} (docs/MAKE.md)", file=sys.stderr)
        return 2
    return gpu_check(py, external=True)


def install(py: str, a: argparse.Namespace, rebuild: bool) -> bool:
    """pip, in the order mk/setup.mk gives; False (and one line) when a step fails."""
    index = ["--index-url", a.torch_index] if a.torch_index else []
    steps = [["install", "-q", "--upgrade", "pip"],
             *([["uninstall", "-q", "-y", "torch"]] if rebuild else []),  # another build
             ["install", "-q", a.torch, *index],
             ["install", "-q", "-e", f".[{a.extras}]"],
             ["install", "-q", "--no-deps", a.evalplus]]
    for s in steps:
        if _run([py, "-m", "pip", *s]):
            print(f"setup: pip {' '.join(s)} failed (no package registry here? docs/MAKE.md: "
                  "offline nodes)", file=sys.stderr)
            return False
    system_tools(a.tools, apt=True)
    return True


def setup(a: argparse.Namespace) -> int:
    """The environment every target runs in; pip only when it misses a declared requirement."""
    pins, extras, pyproject = [a.torch, a.evalplus], a.extras.split(","), Path(a.pyproject)
    if a.python:
        return external(a, pyproject)
    venv = Path(a.venv)
    py, stamp = str(venv / "bin" / "python"), venv / ".setup-stamp"
    fresh = not os.access(py, os.X_OK)
    rebuild = bool(a.torch_index) and not fresh and torch_build_differs(py, a.torch_index)
    want = requirements_hash(pyproject, extras, pins)
    if not (fresh or rebuild) and stamp.is_file() and stamp.read_text().strip() == want:
        return gpu_check(py) if a.gpu else 0  # the fast path: the venv's python is not started
    if fresh and _run([sys.executable, "-m", "venv", str(venv)]):
        return 1
    ask = ["check", "--pyproject", str(pyproject), "--extras", *extras, "--pins", *pins]
    r = None if fresh or rebuild else _ask(py, *ask)
    if r is not None and r.returncode == 0:
        print(f"setup: {venv} already meets pyproject.toml's requirements; nothing installed")
        system_tools(a.tools, apt=False)
    else:
        if r is not None:
            print(f"setup: {venv} misses {r.stdout.strip() or r.stderr.strip()[-300:]}; installing")
        if not install(py, a, rebuild):
            return 1
        r = _ask(py, *ask)
        if r.returncode:
            print(f"setup: after installing, {venv} still misses {r.stdout.strip()}",
                  file=sys.stderr)
            return 1
    stamp.write_text(want + "\n")
    return gpu_check(py)


def gpu_check(py: str, external: bool = False) -> int:
    """On a host with GPUs, ask the interpreter whether torch sees them (no GPUs: no import)."""
    why = gpus_expected()
    if why is None:
        return 0
    return _ask(py, "gpu", why, driver(), *(["--external"] if external else []),
                capture=False).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mk/venv.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unknown")
    u.add_argument("goals")
    u.add_argument("known")
    u.add_argument("globals", help="the variables every target takes")
    u.add_argument("names", nargs="+", help="NAME=target,target (the targets that take NAME)")
    s = sub.add_parser("setup")
    s.add_argument("--venv", required=True)
    s.add_argument("--python", default="")
    s.add_argument("--torch", required=True)
    s.add_argument("--evalplus", required=True)
    s.add_argument("--extras", default="dev,bench")
    s.add_argument("--torch-index", default="")
    s.add_argument("--bundle", nargs="*", default=[])
    s.add_argument("--tools", nargs="*", default=[])
    s.add_argument("--gpu", action="store_true", help="check the GPUs on the fast path too")
    s.add_argument("--pyproject", default=str(ROOT / "pyproject.toml"))
    c = sub.add_parser("check")
    c.add_argument("--external", action="store_true")
    c.add_argument("--extras", nargs="*", default=[])
    c.add_argument("--pins", nargs="*", default=[])
    c.add_argument("--bundle", nargs="*", default=[])
    c.add_argument("--pyproject", default=None)
    g = sub.add_parser("gpu")
    g.add_argument("why")
    g.add_argument("driver")
    g.add_argument("--external", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "unknown":
        names = dict(n.partition("=")[::2] for n in a.names)
        takers = {k: [t for t in v.split(",") if t] for k, v in names.items()}
        print(unknown(a.goals, a.known.split(), takers, a.globals.split()))
        return 0
    if a.cmd == "check":
        return check(a)
    if a.cmd == "gpu":
        return gpu(a.why, a.driver, a.external)
    return setup(a)


if __name__ == "__main__":
    sys.exit(main())
