"""Run model-written code contained: evalplus's checker inside a locked-down subprocess.

evalplus is not a security sandbox (its own docstring says so): each check runs in a forked
process with a 4 GiB cap, a per-input time limit and some stdlib functions set to None. We add,
in layers, so one bypass does not free the code:

1. an outer subprocess in its own session (the whole process group is killed at the wall-clock
   deadline), with a throwaway working directory, TMPDIR and HOME, and a minimal environment;
2. no network: the process starts inside a fresh network namespace (`unshare -n`, or
   `unshare -rn` for a non-root user), which holds only a downed loopback;
3. when started as root, it drops to an unprivileged uid (nobody) that keeps only
   CAP_DAC_READ_SEARCH (to reach the interpreter), so the file system's own permissions protect
   everything outside the throwaway directory from writes, and RLIMIT_NPROC applies;
4. resource limits: address space, CPU seconds, file size, no core files, max processes;
5. inside every evalplus check process, just before the model's code is exec'd, a Python audit
   hook (which cannot be removed once added) refuses: fork/exec/spawn/subprocess, kill, sockets,
   ctypes (a way around the hook), setrlimit, and any file deletion, rename, chmod or write
   outside the throwaway directory. A refused call raises PermissionError: the sample fails.

`python -m experiments.sandbox evalplus --dataset humaneval --samples s.jsonl --problems p.jsonl`
is the entry the outer process runs; `run_evalplus(...)` starts it from the evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DENY = {
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
    "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
    "socket.gethostbyname", "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function",
    "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid", "os.chroot",
    "webbrowser.open",
}
_PATH_EVENTS = {"os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink", "os.truncate",
                "os.chmod", "os.chown", "os.chflags", "os.lchown", "os.utime", "shutil.rmtree",
                "shutil.move", "os.mkdir", "os.mknod", "os.mkfifo", "os.removexattr",
                "os.setxattr"}


def install_guard(allowed_root: str) -> None:
    """Add the audit hook that contains untrusted code (irreversible for this process)."""
    root = os.path.realpath(allowed_root)

    def inside(p: object) -> bool:
        if isinstance(p, int) or p is None:
            return True  # file descriptors: opened under the same checks
        try:
            rp = os.path.realpath(os.fsdecode(p))
        except (TypeError, ValueError):
            return False
        return rp == root or rp.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event in _DENY:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = (list(args) + [None, None, 0])[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed")
        elif event in _PATH_EVENTS:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            if not all(inside(p) for p in paths):
                raise PermissionError(f"sandbox: {event} outside the sandbox dir")

    sys.addaudithook(hook)


@dataclass
class SandboxResult:
    returncode: int | None
    timed_out: bool
    elapsed_s: float
    stdout: str
    stderr: str


def _net_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        return []  # layer 5 (socket events refused) still applies
    flag = "-n" if os.geteuid() == 0 else "-rn"
    try:
        ok = subprocess.run([unshare, flag, "true"], capture_output=True, timeout=10).returncode
    except (OSError, subprocess.SubprocessError):
        ok = 1
    return [unshare, flag, "--"] if ok == 0 else []


def run_sandboxed(argv: list[str], workdir: str | os.PathLike, timeout_s: float,
                  mem_bytes: int = 6 << 30, cpu_s: int | None = None, nproc: int = 512,
                  env: dict[str, str] | None = None) -> SandboxResult:
    """Run argv (a python -m ... command) contained; see the module docstring for the layers."""
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    drop = os.geteuid() == 0
    if drop:
        for p in [wd, *wd.rglob("*")]:
            os.chown(p, NOBODY, NOBODY)
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(wd),
                "TMPDIR": str(wd), "XDG_CACHE_HOME": str(wd / ".cache"), "LANG": "C.UTF-8",
                "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
                "SANDBOX_ROOT": str(wd)}
    base_env.update(env or {})
    cpu = cpu_s if cpu_s is not None else int(timeout_s * 4) + 60

    def preexec() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    cmd = _net_prefix()
    if drop:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("sandbox: running as root needs `setpriv` to drop privileges")
        # read-and-search everywhere (the interpreter may live under a 0700 /root), write nowhere
        cmd += [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    cmd += ["prlimit", f"--nproc={nproc}", "--"] if shutil.which("prlimit") else []
    cmd += argv
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=wd, env=base_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=preexec)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        out, err = proc.communicate()
    _kill_group(proc.pid)  # leftovers (e.g. a child that outlived its parent)
    return SandboxResult(proc.returncode, timed_out, time.monotonic() - t0, out, err)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_evalplus(dataset: str, samples: str | os.PathLike, problems: str | os.PathLike,
                 timeout_s: float, parallel: int = 2) -> tuple[dict, SandboxResult]:
    """Evaluate samples.jsonl with evalplus's own evaluator inside the sandbox.

    dataset: "humaneval" | "mbpp"; problems: the evalplus dataset jsonl (a subset for LIMIT).
    Returns evalplus's result dict ({"eval": {task_id: [{base_status, plus_status, ...}]}})
    or {} if the run died, and the sandbox record.
    """
    wd = Path(tempfile.mkdtemp(prefix=f"ftbench-evalplus-{dataset}-"))
    try:
        shutil.copy(samples, wd / "samples.jsonl")
        shutil.copy(problems, wd / "problems.jsonl")
        res = run_sandboxed([sys.executable, "-m", "experiments.sandbox", "evalplus",
                             "--dataset", dataset, "--samples", str(wd / "samples.jsonl"),
                             "--problems", str(wd / "problems.jsonl"),
                             "--parallel", str(parallel)], wd, timeout_s)
        out = wd / "samples_eval_results.json"
        result = json.loads(out.read_text()) if out.is_file() else {}
        return result, res
    finally:
        shutil.rmtree(wd, ignore_errors=True)


def _evalplus_main(args: argparse.Namespace) -> None:
    """Inside the sandbox: evalplus's evaluate(), with the guard added to every check."""
    os.environ["HUMANEVAL_OVERRIDE_PATH" if args.dataset == "humaneval"
               else "MBPP_OVERRIDE_PATH"] = args.problems  # read at import time
    import evalplus.eval as ev
    from evalplus.evaluate import evaluate

    root = os.environ.get("SANDBOX_ROOT", os.getcwd())
    orig = ev.reliability_guard

    def guarded(maximum_memory_bytes: int | None = None) -> None:
        orig(maximum_memory_bytes)
        install_guard(root)

    ev.reliability_guard = guarded
    evaluate(args.dataset, samples=args.samples, parallel=args.parallel, i_just_wanna_run=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # evalplus leaves a watchdog thread that would hold the process ~20 s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("evalplus")
    e.add_argument("--dataset", choices=["humaneval", "mbpp"], required=True)
    e.add_argument("--samples", required=True)
    e.add_argument("--problems", required=True)
    e.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args(argv)
    if args.cmd == "evalplus":
        _evalplus_main(args)


if __name__ == "__main__":
    main()
