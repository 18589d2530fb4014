"""Run model-written code contained by kernel namespaces (bubblewrap), one sandbox per check.

What holds the code (outermost first), and why:

1. bubblewrap (`bwrap`): new PID, network, IPC, UTS (and cgroup) namespaces; `--die-with-parent`
   and `--new-session`. When the sandbox's main process ends or the parent kills it at the
   wall-clock deadline, its PID namespace goes with it: no process outlives the check. No network
   (and abstract unix sockets are per network namespace).
2. A file system built from nothing: read-only binds of /usr, the Python install and its venv,
   and the one runner file; a fresh /proc and /dev; a size-limited tmpfs at /tmp as the only
   writable place. Benchmark files, results, caches and other runs' files are not in the view.
3. As root: every sandbox runs under its own unused uid (from a locked pool) with no
   capabilities (`setpriv --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs`), so
   root-only files stay unreadable, RLIMIT_NPROC counts this sandbox alone, and nothing in it can
   signal the evaluator or another sandbox. A cgroup with `pids.max` is added where the pids
   controller is writable (v2 or v1). Unprivileged: bwrap's user namespace with `--cap-drop ALL`.
4. rlimits set outside with `prlimit` as hard limits (the code cannot raise them): address space,
   CPU seconds, file size, open files, processes, no core files.
5. Inside, evalplus's `reliability_guard` and our audit hook (`codecheck_child.install_guard`),
   kept as inner layers only.

Time is measured here, not inside: the inputs are fed one at a time through a pipe, each once the
previous one is answered, and `_exchange` times each answer on this process's clock, killing the
sandbox when an input's own limit passes (`ChildRun.late`) or the run's wall clock does. The
code's timers and clocks (which it can cancel or replace) decide nothing.

The sandboxed runner never sees expected outputs or verdicts: it prints the function's outputs as
plain data and the caller compares (experiments.eval.codecheck). Where namespaces are unavailable
the suite refuses (one line saying why) unless `FTBENCH_SANDBOX=weak` opts into a weaker sandbox
(own session, dropped uid, rlimits, audit hook); the isolation in force is recorded in every
result file (`isolation().record()`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.eval.codecheck_child import LOADED_LINE, READY_LINE

CHILD = Path(__file__).resolve().with_name("codecheck_child.py")
UID_BASE, UID_SPAN = 1_900_000_000, 100_000_000  # far above any account or subuid range
UID_LOCK_DIR = Path("/run/ftbench-sandbox-uids")
TMPFS_BYTES = 64 << 20
MEM_BYTES = 4 << 30  # evalplus's default EVALPLUS_MAX_MEMORY_BYTES
NPROC = 32  # processes + threads of one sandbox (its own uid, so shared with nothing)
NOFILE = 256
MAX_OUTPUT = 256 << 20  # bytes of outputs a check may print back
# host paths bound read-only at the same place (tests use it to put canaries in the code's view)
EXTRA_RO_BINDS: list[str] = []
# what this process handed out, for checks that nothing outlived its sandbox
ISSUED_UIDS: set[int] = set()
LIVE_CGROUPS: set[Path] = set()


@dataclass
class ChildRun:
    """What one sandboxed run left: parsed result (None if it left none) and how it ended."""
    ready: bool  # the runner reached the program code (else the sandbox itself failed)
    result: dict | None
    timed_out: bool
    overflow: bool
    returncode: int | None
    elapsed_s: float
    leftovers: int  # processes still alive after the run that the cleanup had to kill
    stderr_tail: str = field(repr=False, default="")  # for debugging only; never stored
    late: int | None = None  # the input not answered within its own limit (the run was killed)
    round_trips: list[float] = field(default_factory=list)  # per answered input, our clock


@dataclass(frozen=True)
class Isolation:
    mode: str  # "bwrap-root" | "bwrap-userns" | "weak" | "unavailable"
    reason: str | None  # why namespaces are not in force (None when they are)
    detail: tuple[tuple[str, Any], ...] = ()

    @property
    def usable(self) -> bool:
        return self.mode != "unavailable"

    def record(self) -> dict[str, Any]:
        """The description stored in result files."""
        return {"mode": self.mode, "reason": self.reason, **dict(self.detail)}


def _bwrap_version(bwrap: str) -> str:
    try:
        return subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---- cgroup: a pids.max per sandbox where the controller is writable ----

def _cgroup_base() -> tuple[str, Path] | None:
    """(version, directory under which we may create cgroups with pids.max), or None."""
    own = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            own[ctrls] = path
    except OSError:
        return None
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").is_file():  # a unified (v2-only) mount
        base = v2 / own.get("", "/").lstrip("/")
        try:
            if "pids" in (base / "cgroup.subtree_control").read_text().split():
                return "v2", base
        except OSError:
            pass
    for ctrls, path in own.items():
        if "pids" in ctrls.split(","):
            base = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
            if (base / "cgroup.procs").is_file():
                return "v1", base
    return None


class _Cgroup:
    def __init__(self, base: Path, version: str, pids_max: int) -> None:
        self.version = version
        self.path = base / f"ftbench-{uuid.uuid4().hex[:12]}"
        self.path.mkdir()
        LIVE_CGROUPS.add(self.path)
        (self.path / "pids.max").write_text(str(pids_max))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:  # gone: nothing left in it
            return []

    def kill_all(self) -> int:
        """SIGKILL what is left; returns how many processes were still alive after a grace."""
        for _ in range(25):  # bwrap's init may still be exiting: not a leftover
            if not self.pids():
                return 0
            time.sleep(0.01)
        return _kill_while(self.pids, self._cgroup_kill)

    def _cgroup_kill(self) -> None:
        if self.version == "v2" and (self.path / "cgroup.kill").exists():
            (self.path / "cgroup.kill").write_text("1")

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                LIVE_CGROUPS.discard(self.path)
                return
            except FileNotFoundError:
                LIVE_CGROUPS.discard(self.path)
                return
            except OSError:
                time.sleep(0.02)


# ---- a unique uid per sandbox (root only) ----

class _Uid:
    """An unused uid, locked for the lifetime of one sandbox (across processes, via flock)."""

    def __init__(self) -> None:
        UID_LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        rng = random.SystemRandom()
        for _ in range(1000):
            uid = UID_BASE + rng.randrange(UID_SPAN)
            fd = os.open(UID_LOCK_DIR / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            if _uid_processes(uid):  # a leftover from a crashed evaluator: not this one
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            ISSUED_UIDS.add(uid)
            return
        raise RuntimeError("sandbox: no free uid")

    def release(self) -> None:
        try:
            os.unlink(UID_LOCK_DIR / str(self.uid))
        except OSError:
            pass
        os.close(self._fd)


def _uid_processes(uid: int) -> list[int]:
    """Pids whose real, effective or saved uid is uid (the host's /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        if str(uid).encode() in line.split()[1:4]:
                            out.append(int(d))
                        break
        except OSError:
            continue
    return out


def _kill_while(pids: Callable[[], list[int]], before: Callable[[], Any] = lambda: None) -> int:
    """SIGKILL what `pids()` lists (after `before()`) until it lists nothing, at most 50 rounds;
    the number of processes that were still alive to receive it."""
    n = 0
    for _ in range(50):
        live = pids()
        if not live:
            break
        before()
        for p in live:
            try:
                os.kill(p, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    return n


# ---- the bwrap command line ----

def _python_roots() -> list[str]:
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    if sys.prefix != sys.base_prefix:  # a venv: bind it where its own paths point
        roots.add(os.path.abspath(sys.prefix))
    keep = sorted(r for r in roots if r != "/" and not r.startswith("/usr/"))
    # drop roots inside other roots
    return [r for r in keep if not any(r != o and r.startswith(o + "/") for o in keep)]


def _bwrap_args(bwrap: str, as_root: bool, tmpfs_bytes: int, ep_utils: str) -> list[str]:
    a = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
         "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if as_root:  # root: no user namespace; setpriv (inside) drops to the sandbox's own uid
        a += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
              "--cap-add", "CAP_SETPCAP"]
    else:
        a += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    a += ["--ro-bind", "/usr", "/usr"]
    for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / d
        if p.is_symlink():
            a += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            a += ["--ro-bind", str(p), str(p)]
    a += ["--perms", "0755", "--dir", "/etc", "--perms", "0755", "--dir", "/opt"]
    for f in ("/etc/ld.so.cache", "/etc/localtime"):
        a += ["--ro-bind-try", f, f]
    # The tmpfs first: a Python install or venv that lives under /tmp (a checkout there) is then
    # bound on top of it, read-only, instead of being hidden by it.
    a += ["--perms", "01777", "--size", str(tmpfs_bytes), "--tmpfs", "/tmp"]
    made: set[str] = {"/", "/usr", "/tmp", "/proc", "/dev", "/etc", "/opt"}
    for root in [*_python_roots(), *EXTRA_RO_BINDS]:
        for anc in reversed(Path(root).parents):  # bwrap would make these 0700
            if str(anc) not in made:
                made.add(str(anc))
                a += ["--perms", "0755", "--dir", str(anc)]
        a += ["--ro-bind", root, root]
    a += ["--ro-bind", str(CHILD), "/opt/child.py", "--ro-bind", ep_utils, "/opt/evalplus_utils.py",
          "--proc", "/proc", "--dev", "/dev"]
    a += ["--chdir", "/tmp", "--clearenv"]
    for k, v in _child_env("/tmp").items():
        a += ["--setenv", k, v]
    return a + ["--"]


def _child_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1"}


def _prlimit(timeout_s: float, mem_bytes: int, tmpfs_bytes: int, nproc: int | None) -> list[str]:
    cpu = int(timeout_s) + 5
    a = ["prlimit", f"--as={mem_bytes}", f"--cpu={cpu}", f"--fsize={tmpfs_bytes}",
         f"--nofile={NOFILE}", "--core=0"]
    if nproc is not None:
        a.append(f"--nproc={nproc}")
    return a + ["--"]


def _evalplus_utils() -> str:
    import evalplus.eval.utils as u

    return u.__file__


# ---- probing what is available ----

def closed_parent(path: str | os.PathLike) -> Path | None:
    """The first parent directory of `path` that other users cannot traverse (no o+x)."""
    for d in reversed(Path(path).resolve().parents):
        try:
            if not d.stat().st_mode & 0o001:
                return d
        except OSError:
            return d
    return None


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The strongest isolation this machine gives, probed once per process by a real run."""
    want = os.environ.get("FTBENCH_SANDBOX", "").strip().lower()
    bwrap = shutil.which("bwrap")
    as_root = os.geteuid() == 0
    missing = [t for t in ("prlimit", *(("setpriv",) if as_root else ())) if not shutil.which(t)]
    reason = None
    if bwrap is None:
        reason = "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)"
    elif missing:
        reason = f"{', '.join(missing)} not found (util-linux)"
    else:
        mode = "bwrap-root" if as_root else "bwrap-userns"
        cg = _cgroup_base() if as_root else None
        if cg is not None:  # is creating a cgroup actually allowed here?
            try:
                _Cgroup(cg[1], cg[0], 8).remove()
            except OSError:
                cg = None
        iso = Isolation(mode, None, (
            ("tool", _bwrap_version(bwrap)),
            ("namespaces", ["pid", "net", "ipc", "uts", "mount"] + ([] if as_root else ["user"])),
            ("uid", "own unused uid per sandbox, no capabilities" if as_root
             else "invoking user's uid in a user namespace, no capabilities"),
            ("cgroup_pids_max", f"{cg[0]} pids.max={NPROC + 8}" if cg else None),
            ("nproc_rlimit", NPROC if as_root else None),
            ("tmpfs_bytes", TMPFS_BYTES), ("mem_bytes", MEM_BYTES),
            ("audit_hook", True)))
        probe = _probe(iso)
        if probe is None:
            return iso
        reason = f"bubblewrap cannot create namespaces here ({probe})"
    if want == "weak":
        net = as_root and shutil.which("unshare") is not None
        own_uid = as_root and shutil.which("setpriv") is not None
        # weak mode has no mount namespace: its unprivileged uid runs this interpreter and the
        # child script in place, so every parent directory must be open to other users
        closed = (closed_parent(sys.prefix) or closed_parent(CHILD)) if own_uid else None
        if closed is not None:
            reason += (f"; its unprivileged uid cannot traverse {closed} (mode "
                       f"{oct(closed.stat().st_mode & 0o777)}), so no check can start: move the "
                       "checkout or `chmod o+x` that directory")
        weak = Isolation("weak", reason, (
            ("namespaces", ["net"] if net else []),
            ("uid", "own unused uid per sandbox" if own_uid else "invoking user's uid"),
            ("audit_hook", True), ("mem_bytes", MEM_BYTES),
            ("closed_parent", str(closed) if closed else None)))
        print(f"sandbox: WEAK isolation (FTBENCH_SANDBOX=weak): {reason}", file=sys.stderr)
        return weak
    print(f"sandbox: refusing to run model code: {reason}; install bubblewrap, or set "
          "FTBENCH_SANDBOX=weak to accept a weaker sandbox (recorded in the results)",
          file=sys.stderr)
    return Isolation("unavailable", reason)


def _probe(iso: Isolation) -> str | None:
    """None if a trivial job runs to completion under iso, else a one-line reason."""
    job = {"mode": "gt", "code": "def f():\n    return 1\n", "entry_point": "f",
           "inputs": ['["l",[]]']}  # one input: no arguments
    try:
        r = run_child(job, timeout_s=60, iso=iso)
    except Exception as e:  # e.g. no free uid, cgroup refused: report, never raise
        return f"{type(e).__name__}: {str(e)[:160]}"
    if r.result is not None and r.result.get("status") == "ok" and r.result.get("outputs") == [1]:
        return None
    tail = r.stderr_tail.strip().splitlines()
    return (tail[-1][:200] if tail else f"exit {r.returncode}")


# ---- one sandboxed run ----

def run_child(job: dict, timeout_s: float, iso: Isolation | None = None,
              mem_bytes: int = MEM_BYTES, tmpfs_bytes: int = TMPFS_BYTES,
              max_output: int = MAX_OUTPUT,
              input_limits_s: list[float] | None = None) -> ChildRun:
    """Run the runner on one job inside a fresh sandbox; kill everything at timeout_s.

    With input_limits_s, the inputs (job["inputs"]) are fed one at a time, each once the
    previous one is answered, and timed here: when input i's answer is not in by
    input_limits_s[i] seconds after it was sent, the sandbox is killed and the run records
    `late = i` (`round_trips`: each answered input's time). Without, they all go at once.
    """
    iso = iso or isolation()
    if not iso.usable:
        raise RuntimeError(f"sandbox unavailable: {iso.reason}")
    as_root = os.geteuid() == 0
    feed = [s.encode() for s in job.get("inputs", [])]  # one encoded input per line
    if input_limits_s is not None and len(input_limits_s) != len(feed):
        raise ValueError(f"{len(input_limits_s)} input limits for {len(feed)} inputs")
    job = {k: v for k, v in job.items() if k != "inputs"}
    job.update(evalplus_utils="/opt/evalplus_utils.py", max_memory=mem_bytes)
    uid = _Uid() if as_root and shutil.which("setpriv") else None
    cg = None
    hostdir = None
    t0 = time.monotonic()
    try:
        cmd = _prlimit(timeout_s, mem_bytes, tmpfs_bytes, NPROC if uid else None)
        if iso.mode.startswith("bwrap"):
            job["workdir"] = "/tmp/work"
            cmd += _bwrap_args(shutil.which("bwrap") or "bwrap", as_root, tmpfs_bytes,
                               _evalplus_utils())
            child, env = "/opt/child.py", _child_env("/tmp")
        else:  # weak: a throwaway host directory, own session, dropped uid where root
            hostdir = Path(tempfile.mkdtemp(prefix="ftbench-sandbox-"))
            job["workdir"] = str(hostdir)
            job["evalplus_utils"] = _evalplus_utils()
            if uid:
                os.chown(hostdir, uid.uid, uid.uid)
            cmd += ([shutil.which("unshare") or "unshare", "-n", "--"] if as_root else [])
            child, env = str(CHILD), _child_env(str(hostdir))
        if uid:
            cmd += ["setpriv", f"--reuid={uid.uid}", f"--regid={uid.uid}", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        cmd += [sys.executable, "-I", child]
        if as_root and iso.record().get("cgroup_pids_max"):
            base = _cgroup_base()
            if base is not None:
                cg = _Cgroup(base[1], base[0], NPROC + 8)
                # join before anything forks: a shell moves itself, then execs the rest
                cmd = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
                       str(cg.path / "cgroup.procs"), *cmd]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True,
                                cwd=str(hostdir) if hostdir else "/")
        ex = _exchange(proc, json.dumps(job).encode() + b"\n", feed, input_limits_s,
                       t0 + timeout_s, max_output)
        if proc.poll() is None:
            _kill(proc)
        proc.wait()
        # the namespace died with bwrap; these sweeps are the second and third line
        leftovers = 0
        if cg is not None:
            leftovers += cg.kill_all()
        if uid is not None:
            leftovers += _kill_while(functools.partial(_uid_processes, uid.uid))
        elif iso.mode == "weak":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if cg is not None:
            cg.remove()
        if uid is not None:
            uid.release()
        if hostdir is not None:
            shutil.rmtree(hostdir, ignore_errors=True)
    result = None
    if ex.ready and not ex.overflow and ex.late is None and not ex.timed_out:
        result = _result(ex.answers, ex.end, len(feed))
    return ChildRun(ex.ready, result, ex.timed_out, ex.overflow, proc.returncode,
                    time.monotonic() - t0, leftovers, ex.err.decode(errors="replace"),
                    ex.late, ex.round_trips)


def _result(answers: list[bytes], end: bytes | None, n: int) -> dict | None:
    """{"status": "ok", "outputs", "times", "walls"} when every input got a well-formed
    answer, the runner's own error line when it ended on one, else None (it left no result)."""
    def parse(line: bytes) -> Any:
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            return None

    if end is not None:
        msg = parse(end)
        return msg if isinstance(msg, dict) and msg.get("status") == "error" else None
    if len(answers) != n:
        return None
    outputs, times, walls = [], [], []
    for line in answers:
        msg = parse(line)
        if not isinstance(msg, dict) or "o" not in msg or not set(msg) <= {"o", "t", "w"}:
            return None
        outputs.append(msg["o"])
        if "t" in msg:
            times.append(msg["t"])
        if "w" in msg:
            walls.append(msg["w"])
    return {"status": "ok", "outputs": outputs, "times": times, "walls": walls}


@dataclass
class _Exchange:
    ready: bool = False
    answers: list[bytes] = field(default_factory=list)  # raw lines, parsed after the run
    end: bytes | None = None  # the line that ended the run early (an error), if any
    round_trips: list[float] = field(default_factory=list)
    late: int | None = None
    timed_out: bool = False
    overflow: bool = False
    err: bytes = b""


def _exchange(proc: subprocess.Popen, job_line: bytes, feed: list[bytes],
              limits: list[float] | None, deadline: float, max_output: int) -> _Exchange:
    """Feed the job and the inputs; with limits, one at a time, each answer timed.

    Without limits (the canonical run: trusted code, timed by the runner as evalplus does) all
    inputs go at once. With them, an input goes once the previous one is answered and its clock
    starts when we begin writing it. It is late when a read of everything the sandbox had
    written, begun at or after its deadline, ends without its answer: so a stall of this process
    (another thread holding the GIL, a busy machine) never makes an answer late, and the checked
    code, which cannot reach this clock, cannot make a late answer on time. Answers are only
    split into lines here (parsed after the run), to keep each pass short.
    """
    ex = _Exchange()
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    for fd in (out_fd, err_fd, in_fd):
        os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(out_fd, selectors.EVENT_READ, "out")
    sel.register(err_fd, selectors.EVENT_READ, "err")
    pending = memoryview(job_line)
    sel.register(in_fd, selectors.EVENT_WRITE, "in")
    writing, stdin_open = True, True
    buf, err = bytearray(), bytearray()
    total, scanned = 0, 0
    stage = 0  # 0: before READY_LINE, 1: before LOADED_LINE, 2: answering, 3: finished
    big = float("inf")
    sent_at, in_deadline = 0.0, big
    grace_end = None  # once finished: how long the sandbox may take to exit by itself
    open_ = 2

    def close_stdin() -> None:
        nonlocal writing, stdin_open
        if writing:
            sel.unregister(in_fd)
            writing = False
        if stdin_open:
            proc.stdin.close()
            stdin_open = False

    def send_next(now: float) -> None:
        nonlocal pending, writing, sent_at, in_deadline, stage, grace_end
        i = len(ex.answers)
        if i == len(feed):  # all answered: stdin closes, the runner exits
            stage, grace_end = 3, min(deadline, now + 5.0)
            close_stdin()
            return
        if limits is None:  # untimed: everything was sent after LOADED_LINE
            if i == 0:
                pending = memoryview(b"".join(x + b"\n" for x in feed))
                sel.register(in_fd, selectors.EVENT_WRITE, "in")
                writing = True
            return
        if buf:  # bytes before input i was sent: not the runner's (it waits for its input)
            ex.end, stage = b"written ahead of its input", 3
            return
        pending = memoryview(feed[i] + b"\n")
        sent_at = time.monotonic()
        in_deadline = sent_at + limits[i]
        try:  # most inputs fit the pipe: written now, no select round for it
            pending = pending[os.write(in_fd, pending[:1 << 16]):]
        except BlockingIOError:
            pass
        except OSError:  # the runner closed its stdin (it died): its stdout tells
            close_stdin()
            return
        if pending:
            sel.register(in_fd, selectors.EVENT_WRITE, "in")
            writing = True

    while open_:
        now = time.monotonic()
        if grace_end is not None and now >= grace_end:
            break  # finished; the cleanup kills what did not exit
        if now >= deadline and grace_end is None:
            ex.timed_out = True
            break
        wake = min(deadline, grace_end or big, in_deadline if stage == 2 else big)
        events = sel.select(timeout=max(0.0, min(wake - now, 1.0)))
        polled = time.monotonic()  # everything written before this is read below
        for key, _ in events:
            if key.data == "in" and writing:
                try:
                    pending = pending[os.write(in_fd, pending[:1 << 16]):]
                except BlockingIOError:
                    pass
                except OSError:  # the runner closed its stdin (it died): its stdout tells
                    pending = memoryview(b"")
                    close_stdin()
                if writing and not pending:
                    sel.unregister(in_fd)
                    writing = False
            elif key.data == "err":
                try:
                    chunk = os.read(err_fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(err_fd)
                    open_ -= 1
                else:
                    err = (err + chunk)[-4096:]
        # drain stdout whether or not select saw it ready (the deadline rule needs a full read)
        eof = False
        while out_fd is not None:
            try:
                chunk = os.read(out_fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            buf += chunk
            total += len(chunk)
            if total > max_output:
                ex.overflow = True
                break
            if len(chunk) < 1 << 16:
                break  # a short read: the pipe held no more when it was read
        if ex.overflow:
            break
        while stage < 3:  # complete lines
            nl = buf.find(b"\n", scanned)
            if nl < 0:
                scanned = len(buf)
                break
            line = bytes(buf[:nl + 1])
            del buf[:nl + 1]
            scanned = 0
            if stage == 0:
                if line != READY_LINE:
                    stage = 3
                    break
                ex.ready, stage = True, 1
            elif stage == 1:
                if writing or line != LOADED_LINE:
                    ex.end, stage = line, 3
                    break
                stage = 2
                send_next(polled)
            else:
                # the runner answers only once it has read the whole input: a line before
                # that (an answer written ahead) is not its answer, and ends the run unscored
                if (writing and limits is not None) or not line.startswith(b'{"o":'):
                    ex.end, stage = line, 3
                    break
                ex.answers.append(line)
                if limits is not None:
                    ex.round_trips.append(polled - sent_at)
                send_next(polled)
        if stage == 2 and polled >= in_deadline and len(ex.answers) < len(feed):
            ex.late = len(ex.answers)  # not in by a read begun after its deadline
            break
        if stage == 3 and grace_end is None:
            grace_end = min(deadline, polled + 5.0)
            close_stdin()
        if eof:
            sel.unregister(out_fd)
            out_fd = None
            open_ -= 1
    sel.close()
    if stdin_open:
        try:
            proc.stdin.close()
        except OSError:
            pass
    if ex.timed_out or ex.overflow or ex.late is not None or open_:
        _kill(proc)
    proc.stdout.close()
    proc.stderr.close()
    ex.err = bytes(err)
    return ex


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL bwrap; its PID namespace (and so every process in it) dies with it."""
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
