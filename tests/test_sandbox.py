"""Hostile completions are contained, score as failures, and cannot forge their verdict.

One batch of ~25 attacks (the issue's list) runs through the real evaluation path
(`codecheck.evaluate`: a sandbox per check, verdict by evalplus outside the sandbox) with a
correct control solution before and after them. After the batch: every attack failed, both
controls passed, canaries inside and outside the code's view are unchanged, nothing connected to
the host's sockets, the root-only secret did not leak, no sandbox process, cgroup or uid lock
remains, and the whole batch finished within its wall-clock budget.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from test_sandbox_timing import ATTACK as DISARMED_SLOW
from test_sandbox_timing import CONTROL as DISARMED

from experiments.eval import codecheck, sandbox
from experiments.eval.codecheck_child import CodecError, decode, digest, dumps, encode, loads

BUDGET_S = 150.0  # the batch's wall-clock budget (it takes ~20-40 s on 2 busy cores)


def _snapshot(d: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(d)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
            for p in sorted(d.rglob("*"))}


def _host_sandbox_processes(token: str) -> list[str]:
    """Host processes of this test's sandboxes: a uid they ran under, or the token."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            status = Path(f"/proc/{d}/status").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        uids = [int(u) for ln in status.splitlines() if ln.startswith("Uid:")
                for u in ln.split()[1:]]
        if any(u in sandbox.ISSUED_UIDS for u in uids) or token.encode() in cmd:
            found.append(f"{d}: {cmd[:80]!r}")
    return found


class _Listeners:
    """A TCP, a path AF_UNIX and an abstract AF_UNIX listener that record any connection."""

    def __init__(self, sock_path: Path, abstract: str) -> None:
        self.got: list[str] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(sock_path))
        os.chmod(sock_path, 0o777)
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + abstract)
        self.stop = threading.Event()
        self.threads = []
        for s, name in ((self.tcp, "tcp"), (self.unix, "unix"), (self.abstract, "abstract")):
            s.listen(4)
            s.settimeout(0.2)
            t = threading.Thread(target=self._accept, args=(s, name), daemon=True)
            t.start()
            self.threads.append(t)

    def _accept(self, s: socket.socket, name: str) -> None:
        while not self.stop.is_set():
            try:
                c, _ = s.accept()
                self.got.append(name)
                c.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=2)
        for s in (self.tcp, self.unix, self.abstract):
            s.close()


@pytest.fixture
def arena(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Canaries: a directory the code can see (read-only bind) with a root-only secret, and
    one outside its view; host sockets; a marker token for leftover processes."""
    token = uuid.uuid4().hex[:12]
    visible = tmp_path / "visible"
    visible.mkdir()
    (visible / "keep.txt").write_text("precious")
    secret = visible / "secret.txt"
    secret.write_text(f"s3cret-{token}")
    secret.chmod(0o600)
    os.chmod(visible, 0o755)
    for p in tmp_path.parents:  # pytest makes these 0700; the view needs to traverse them
        if str(p).startswith("/tmp/"):
            os.chmod(p, 0o755)
    os.chmod(tmp_path, 0o755)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious too")
    monkeypatch.setattr(sandbox, "EXTRA_RO_BINDS", [str(visible)])
    lis = _Listeners(tmp_path / "host.sock", f"ftbench-{token}")
    yield {"token": token, "visible": visible, "secret": secret, "outside": outside,
           "listeners": lis, "tmp": tmp_path}
    lis.close()


def _world_traversable(path: str) -> bool:
    return all(os.stat(d).st_mode & 0o001 for d in Path(path).resolve().parents)


def test_without_namespaces_refuses_unless_opted_in(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """No bwrap: one line and every check missing; FTBENCH_SANDBOX=weak: a weaker sandbox that
    still scores, recorded as such."""
    import shutil

    which = shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda n: None if n == "bwrap" else which(n))
    probe = sandbox.isolation
    probe.cache_clear()
    try:
        monkeypatch.delenv("FTBENCH_SANDBOX", raising=False)
        rep = codecheck.evaluate("humaneval", [problem("W/a")], {"W/a": RIGHT})
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("sandbox: refusing") and "bwrap" in err[0]
        o = rep.outcomes["W/a"]
        assert o.base.status is None and "sandbox unavailable" in o.base.reason
        assert rep.isolation["mode"] == "unavailable"

        probe.cache_clear()
        # Weak mode has no mount namespace: its unprivileged uid runs this very interpreter, so
        # the venv's parents must be traversable (a `mktemp -d` checkout sits under a 0700 dir).
        # There every check is missing, with the closed directory named, never a score.
        monkeypatch.setenv("FTBENCH_SANDBOX", "weak")
        if os.geteuid() == 0 and not _world_traversable(sys.prefix):
            rep = codecheck.evaluate("humaneval", [problem("W/a")], {"W/a": RIGHT})
            closed = str(sandbox.closed_parent(sys.prefix))
            assert closed in capsys.readouterr().err and rep.isolation["closed_parent"] == closed
            o = rep.outcomes["W/a"].base
            assert o.status is None and f"cannot traverse {closed}" in o.reason
            return
        # the same runner and the same clock: code that disarms its timers and answers too
        # slowly is a timeout here too (test_sandbox_timing.py)
        sols = {"W/a": RIGHT, "W/b": WRONG, "W/c": "import os\nos._exit(0)\n" + RIGHT,
                "W/d": DISARMED_SLOW, "W/e": DISARMED}
        rep = codecheck.evaluate("humaneval", [problem(t) for t in sols], sols, parallel=2)
        assert "WEAK" in capsys.readouterr().err
        assert rep.isolation["mode"] == "weak" and "bubblewrap" in rep.isolation["reason"]
        assert {t: (o.base.status, o.plus.status) for t, o in rep.outcomes.items()} == {
            "W/a": ("pass", "pass"), "W/b": ("fail", "fail"), "W/c": ("fail", "fail"),
            "W/d": ("timeout", "fail"), "W/e": ("pass", "pass")}
    finally:
        probe.cache_clear()


def test_the_view_from_inside_with_the_hook_down(arena: dict) -> None:
    """Not root, no capabilities, no network, read-only system, root-only files unreadable,
    none of the host's data directories visible, own PID namespace; and all of it with the
    audit hook rewritten away: the attacks are real (the code forks a setsid process that would
    outlive it and signals it), and the PID namespace, not the cleanup sweeps, ends it."""
    token = arena["token"]
    code = HOOK_OFF + FORK_EXEC + f'''
import os, posix, socket
def f():
    pid = _spawn([_sys.executable, "-c", "import time; time.sleep(1000)", "{token}"])
    posix.kill(pid, 0)  # an os.kill audit event: refused while the hook stands
    st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
    facts = {{"spawned": pid, "uid": os.getuid(), "capeff": st["CapEff"].strip(),
             "capbnd": st["CapBnd"].strip(), "nnp": st["NoNewPrivs"].strip(),
             "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
             "ifaces": sorted(n for _, n in socket.if_nameindex()),
             "root": sorted(os.listdir("/")), "hostname": socket.gethostname(),
             "shared": os.path.exists("/work/shared"), "home": os.path.exists("/home")}}
    for name, path in (("secret", {str(arena["secret"])!r}), ("shadow", "/etc/shadow")):
        try:
            facts[name] = open(path).read()
        except OSError as e:
            facts[name] = type(e).__name__
    for name, path in (("w_usr", "/usr/x"), ("w_visible", {str(arena["visible"])!r} + "/x")):
        try:
            open(path, "w")
            facts[name] = "written"
        except OSError as e:
            facts[name] = type(e).__name__
    return facts
'''
    iso = sandbox.isolation()
    assert iso.mode in ("bwrap-root", "bwrap-userns") and iso.reason is None, iso.record()
    r = sandbox.run_child({"mode": "gt", "code": code, "entry_point": "f",
                           "inputs": [dumps([])]}, timeout_s=30)
    assert r.ready and r.result["status"] == "ok", r.stderr_tail
    facts = decode(r.result["outputs"][0])
    assert facts["spawned"] > 1  # spawned, signalled: the hook was off
    assert r.leftovers == 0  # nothing left for the sweeps: the namespace took it down
    assert _host_sandbox_processes(token) == []
    assert facts["uid"] != 0 and facts["capeff"] == "0000000000000000"
    assert facts["nnp"] == "1"
    assert facts["ifaces"] == ["lo"] and facts["hostname"] == "sandbox"
    assert max(facts["pids"]) < 20  # its own PID namespace
    assert not facts["shared"] and not facts["home"]
    assert facts["secret"] == "PermissionError" and facts["shadow"] == "FileNotFoundError"
    assert facts["w_usr"] == "OSError" or facts["w_usr"].endswith("Error")
    assert facts["w_visible"] != "written" and facts["w_usr"] != "written"
    if sandbox.isolation().mode == "bwrap-root":
        assert sandbox.UID_BASE <= facts["uid"] < sandbox.UID_BASE + sandbox.UID_SPAN
        assert facts["capbnd"] == "0000000000000000"


def test_output_flood_is_cut_and_fails() -> None:
    code = '''
import os, stat
def f():
    for fd in range(64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                while True:
                    os.write(fd, b"x" * 65536)
        except OSError:
            pass
'''
    t0 = time.monotonic()
    r = sandbox.run_child({"mode": "check", "code": code, "entry_point": "f",
                           "inputs": [dumps([])], "time_limits": [20.0]}, timeout_s=30,
                          max_output=1 << 20)
    assert r.overflow and r.result is None and time.monotonic() - t0 < 20


def test_codec_is_exact_and_strict() -> None:
    big = 7 ** 9000  # beyond str()'s 4300-digit limit
    v = [None, True, 0, -5, big, -big, 1.5, float("inf"), -0.0, 3 + 4j, "s\udcff", b"\x00",
         (1, (2,)), {1, 2}, frozenset({3}), {(1, 2): [3.25], "k": {}}, bytearray(b"ab")]
    back = loads(dumps(v))
    assert back == v and type(back[12]) is tuple and type(back[16]) is bytearray
    assert str(back[8]) == "-0.0" and back[4] == big
    nan = loads(dumps(float("nan")))
    assert nan != nan

    class Sub(int):  # crosses as its base value; its overrides play no part
        def __eq__(self, o: object) -> bool:
            return True

        __hash__ = int.__hash__

        def __int__(self) -> int:
            return 99

    class Lst(list):
        def __iter__(self):
            return iter([99])

    from collections import Counter, OrderedDict, namedtuple

    pt = namedtuple("pt", "x y")
    back = loads(dumps([Sub(1), Lst([1, 2]), Counter("aab"), OrderedDict(a=1), pt(1, 2)]))
    assert back == [1, [1, 2], {"a": 2, "b": 1}, {"a": 1}, (1, 2)]
    assert [type(v) for v in back] == [int, list, dict, dict, tuple]
    for bad in (object(), [1, object()], range(3), {"k": object()}, 1.0 .__class__,
                iter([1]), (x for x in [1])):
        with pytest.raises(CodecError):
            encode(bad)
    deep: list = []
    for _ in range(500):
        deep = [deep]
    with pytest.raises(CodecError):
        encode(deep)
    for bad_json in ('["x", [1]]', '[1]', '[]', '{"a": 1}', '["I", "zz"]', '["c", 1, 2]',
                     '["s", [["l", []]]]', "[" * 100000, '["d", [[1]]]', '["l", {}]',
                     '["l", [{"a": 1}]]', "1" * 5000):
        with pytest.raises(CodecError):
            loads(bad_json)


def test_comparison_is_evalplus_own() -> None:
    """Tolerances and special oracles come from evalplus's unsafe_execute (replayed outputs)."""
    c = codecheck._compare
    enc = [encode(x) for x in (0.1 + 0.2, [1.0, 2.0000001])]
    assert c("humaneval", "f", [[0], [1]], [0.3, [1.0, 2.0]], enc, 0, [0.0, 0.0]) == "pass"
    enc = [encode(x) for x in (0.31, [1.0, 2.0])]
    assert c("humaneval", "f", [[0], [1]], [0.3, [1.0, 2.0]], enc, 0, [0.0, 0.0]) == "fail"
    # HumanEval/32's oracle: any root of the polynomial passes
    assert c("humaneval", "find_zero", [[[-6, 11, -6, 1]]], [1.0], [encode(3.0)], 1e-6,
             [0.0]) == "pass"
    # MBPP set-equality and "is not None" oracles
    assert c("mbpp", "similar_elements", [[(1, 2), (2, 1)]], [(1, 2)], [encode((2, 1))], 0,
             [0.0]) == "pass"
    assert c("mbpp", "check_str", [["a"]], [True], [encode(True)], 0, [0.0]) == "pass"
    assert c("mbpp", "check_str", [["a"]], [True], [encode(False)], 0, [0.0]) == "fail"
    # huge outputs may cross as digests, only where evalplus compares by plain ==
    big = [("a", "b")] * 3
    d = ["H", digest(big)]
    e = codecheck.Digest(d[1])
    assert c("humaneval", "f", [[0]], [e], [d], 0, [0.0], True) == "pass"
    assert c("humaneval", "f", [[0]], [e], [encode(big)], 0, [0.0], True) == "pass"
    assert c("humaneval", "f", [[0]], [big], [d], 0, [0.0], True) == "pass"
    assert c("humaneval", "f", [[0]], [e], [encode(big[:2])], 0, [0.0], True) == "fail"
    assert c("humaneval", "f", [[0]], [e], [["H", "0" * 64]], 0, [0.0], True) == "fail"
    assert c("humaneval", "f", [[0]], [big], [d], 0, [0.0], False) == "fail"
    assert c("humaneval", "f", [[0]], [e], [encode([1.5])], 0, [0.0], True) == "fail"
    # a wrong count or a malformed value fails
    assert c("humaneval", "f", [[0], [1]], [1, 2], [1], 0, [0.0, 0.0]) == "fail"
    assert c("humaneval", "f", [[0]], [1], [["zz", 1]], 0, [0.0]) == "fail"


def test_hostile_completions_are_contained(arena: dict) -> None:
    token = arena["token"]
    lis = arena["listeners"]
    host_tmp_before = set(os.listdir("/tmp"))
    vis0, out0 = _snapshot(arena["visible"]), _snapshot(arena["outside"])
    atk = attacks(str(arena["visible"]), str(arena["secret"]), str(arena["outside"] / "keep.txt"),
                  str(arena["tmp"] / "host.sock"), f"ftbench-{token}", os.getpid(), lis.port,
                  token)
    names = ["control_first", *FAST, "control_last"]
    sols = {f"T/{n}": (RIGHT if n.startswith("control") else atk[n]) for n in names}
    probs = [problem(f"T/{n}") for n in names]
    t0 = time.monotonic()
    rep = codecheck.evaluate("humaneval", probs, sols, parallel=4, budget_s=BUDGET_S)
    elapsed = time.monotonic() - t0
    time.sleep(0.5)  # give anything that escaped a moment to act

    st = {n: (rep.outcomes[f"T/{n}"].base.status, rep.outcomes[f"T/{n}"].plus.status,
              rep.outcomes[f"T/{n}"].base.reason) for n in names}
    print(json.dumps(st, indent=0), f"elapsed {elapsed:.1f}s, {rep.sandboxes} sandboxes")
    assert st["control_first"][:2] == ("pass", "pass") and st["control_last"][:2] == \
        ("pass", "pass"), st
    for n in FAST:
        assert st[n][0] in ("fail", "timeout") and st[n][1] == "fail", (n, st[n])
    assert st["cancel_sigalrm"][0] == "timeout"
    assert elapsed < BUDGET_S and not rep.budget_exhausted
    assert _snapshot(arena["visible"]) == vis0 and _snapshot(arena["outside"]) == out0
    for d in ("/", "/tmp", "/usr", str(arena["visible"])):
        assert not Path(d, f"escape-{token}").exists(), d
    assert not Path(f"/tmp/x-{token}").exists()
    assert {n for n in os.listdir("/tmp") if token in n} == set()
    assert {n for n in os.listdir("/dev/shm") if token in n} == set()
    if "samples_eval_results.json" not in host_tmp_before:
        assert not Path("/tmp/samples_eval_results.json").exists()
    assert lis.got == []
    assert token not in json.dumps([rep.isolation, {k: [o.base.reason, o.plus.reason]
                                                    for k, o in rep.outcomes.items()}])
    assert _host_sandbox_processes(token) == []
    assert sandbox.LIVE_CGROUPS == set()
    if sandbox.isolation().mode == "bwrap-root":
        assert sandbox.ISSUED_UIDS
        assert not any((sandbox.UID_LOCK_DIR / str(u)).exists() for u in sandbox.ISSUED_UIDS)


# ---------------------------------------------------------------------------------------------
# the attacks

PROMPT = "def f(x):\n"
CANONICAL = "    return x + 1\n"
WRONG = "def f(x):\n    return x\n"
RIGHT = PROMPT + CANONICAL


def problem(task_id: str) -> dict:
    """A one-line evalplus-format problem (2 base inputs, 2 plus inputs)."""
    return {"task_id": task_id, "prompt": PROMPT, "canonical_solution": CANONICAL,
            "entry_point": "f", "base_input": [[1], [2]], "plus_input": [[3], [40]],
            "atol": 0}


# rewrite the audit hook's code (and every closure of it) into no-ops, found through gc
HOOK_OFF = '''
import gc as _gc
def _noop_code(n):
    names = ["v%d" % i for i in range(n)]
    src = "def outer():\\n" + "".join("    %s = None\\n" % v for v in names)
    src += "    def hook(*a):\\n        " + ("(" + ",".join(names) + ",)" if names else "None")
    src += "\\n        return None\\n    return hook\\n"
    ns = {}
    exec(src, ns)
    return ns["outer"]().__code__
for _o in _gc.get_objects():
    if type(_o) is type(_noop_code) and _o.__name__ in ("hook", "inside"):
        try:
            _o.__code__ = _noop_code(len(_o.__code__.co_freevars))
        except Exception:
            pass
'''

FORK_EXEC = '''
import _posixsubprocess, os as _os, sys as _sys
def _spawn(argv, setsid=True, keep=()):
    r, w = _os.pipe()
    args = [[a.encode() for a in argv], [argv[0].encode()], False, tuple(keep), None, None,
            -1, -1, -1, -1, -1, -1, r, w, True, setsid, -1, None, None, None, -1, None, False]
    try:
        return _posixsubprocess.fork_exec(*args)
    except TypeError:
        return _posixsubprocess.fork_exec(*args[:-1])
'''


def attacks(canary_dir: str, secret: str, outside: str, unix_sock: str, abstract: str,
            parent_pid: int, tcp_port: int, token: str) -> dict[str, str]:
    """name -> solution source. token marks every process an attack leaves behind."""
    sleeper = f'[_sys.executable, "-c", "import time; time.sleep(1000)", "{token}"]'
    a = {
        # the old hole: a results file in the (then writable, env-named) sandbox dir, and
        # the new protocol forged on every pipe the process holds, then an early exit
        "forged_results": f'''
import os, json, stat
for d in ("/tmp", os.environ.get("SANDBOX_ROOT", "/tmp"), {canary_dir!r}):
    try:
        with open(os.path.join(d, "samples_eval_results.json"), "w") as fh:
            fh.write(json.dumps({{"eval": {{"Attack/x": [{{"base_status": "pass",
                                                         "plus_status": "pass"}}]}}}}))
    except Exception:
        pass
for fd in range(0, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b'ftbench-sandbox-ready\\n{{"status":"ok","outputs":[0,0],"times":[]}}\\n')
    except OSError:
        pass
os._exit(0)
''',
        "eq_always_true": '''
class _Any:
    def __eq__(self, o):
        return True
    def __ne__(self, o):
        return False
    __hash__ = object.__hash__
class _Int(int):
    def __eq__(self, o):
        return True
    __hash__ = int.__hash__
def f(x):
    return _Any() if x == 1 else _Int(0)
''',
        # walk the stack to the runner: set any status-like names, shrink its inputs, pad
        # its outputs, then leave at once
        "frame_tamper_exit": '''
import sys, os
def f(x):
    fr = sys._getframe()
    while fr is not None:
        loc = fr.f_locals
        for k in ("stat", "status", "details", "progress"):
            if k in loc:
                loc[k] = "pass"
        if isinstance(loc.get("inputs"), list):
            del loc["inputs"][1:]
        if isinstance(loc.get("outputs"), list):
            loc["outputs"].extend([2, 3, 4, 41])
        fr = fr.f_back
    if x != 1:
        os._exit(0)
    return x
''',
        "dir_fd_escape": HOOK_OFF + f'''
import posix, os
os.getcwd = posix.getcwd
for d in ("/", "/tmp", {canary_dir!r}, "/usr"):
    try:
        fd = posix.open(d, posix.O_RDONLY)
        w = posix.open("escape-{token}", posix.O_CREAT | posix.O_WRONLY, 0o666, dir_fd=fd)
        posix.write(w, b"escaped")
    except Exception:
        pass
''' + WRONG,
        "root_secret_leak": HOOK_OFF + f'''
import posix
try:
    fd = posix.open({secret!r}, posix.O_RDONLY)
    data = posix.read(fd, 100).decode()
except Exception as e:
    data = repr(e)
def f(x):
    raise RuntimeError("leak: " + data)
''',
        "fork_exec_setsid": FORK_EXEC + f'''
for _ in range(3):
    try:
        _spawn({sleeper}, setsid=True)
    except Exception:
        pass
''' + WRONG,
        "audit_hook_off_writes": HOOK_OFF + f'''
import io, os
for p in ({canary_dir!r} + "/keep.txt", {canary_dir!r} + "/new-{token}", "/tmp/x-{token}",
          {outside!r}):
    try:
        with io.open(p, "w") as fh:
            fh.write("gone")
    except Exception:
        pass
''' + WRONG,
        "unix_and_tcp_sockets": HOOK_OFF + f'''
import _socket
for fam, addr in ((_socket.AF_UNIX, {unix_sock!r}), (_socket.AF_UNIX, "\\0" + {abstract!r}),
                  (_socket.AF_INET, ("127.0.0.1", {tcp_port}))):
    try:
        s = _socket.socket(fam, _socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(addr)
        s.send(b"leak")
    except Exception:
        pass
''' + WRONG,
        "kill_parent": HOOK_OFF + FORK_EXEC + f'''
import posix, signal, os
for pid in ({parent_pid}, 1, os.getppid(), 0, -1):
    try:
        if pid not in (0, -1):
            fd = os.pidfd_open(pid)
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except Exception:
        pass
for argv in (["/usr/bin/kill", "-9", "0"], ["/usr/bin/kill", "-9", "-1"],
             ["/usr/bin/kill", "-9", "{parent_pid}"]):
    try:
        _spawn(argv, setsid=False)
    except Exception:
        pass
try:
    posix.kill({parent_pid}, signal.SIGKILL)
except Exception:
    pass
''' + WRONG,
        "threads_500": '''
import threading, time
for _ in range(500):
    try:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    except Exception:
        break
''' + WRONG,
        "threads_10000": HOOK_OFF + '''
import _thread, time
for _ in range(10000):
    try:
        _thread.start_new_thread(time.sleep, (30,))
    except Exception:
        pass
''' + WRONG,
        "malformed_results": '''
import os, stat
for fd in range(0, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b"ftbench-sandbox-ready\\n" + b"[" * 200000 + b"\\n{not json\\n")
    except OSError:
        pass
os._exit(0)
''',
        "cancel_sigalrm": '''
import signal
def f(x):
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        pass
''',
        "setsid_child_holds_pipes": FORK_EXEC + f'''
try:
    _spawn({sleeper}, setsid=True, keep=tuple(range(0, 20)))
except Exception:
    pass
''' + WRONG,
        "fill_disk": HOOK_OFF + f'''
import io
for p in ("/tmp/fill-{token}", "/dev/shm/fill-{token}", "fill-{token}"):
    try:
        with io.open(p, "wb") as fh:
            while True:
                fh.write(bytes(1 << 20))
    except Exception:
        pass
''' + WRONG,
        "non_daemon_thread": '''
import threading, time
threading.Thread(target=time.sleep, args=(10 ** 6,)).start()
''' + WRONG,
        "deep_recursion": '''
import sys
sys.setrecursionlimit(10 ** 7)
def f(x):
    def r(n):
        return r(n + 1) + 1
    return r(0)
''',
        "multiprocessing": HOOK_OFF + '''
import posix, time, multiprocessing
try:
    multiprocessing.Process(target=time.sleep, args=(1000,)).start()
except Exception:
    pass
if posix.fork() == 0:
    time.sleep(1000)
''' + WRONG,
        "pty": HOOK_OFF + '''
import posix, time
try:
    pid, fd = posix.forkpty()
    if pid == 0:
        time.sleep(1000)
except Exception:
    pass
''' + WRONG,
        "posix_spawn": HOOK_OFF + f'''
import posix, sys
try:
    posix.posix_spawn(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)",
                                       "{token}"], {{}})
except Exception:
    pass
''' + WRONG,
        "fileio_shutil_writes": HOOK_OFF + f'''
import io, os, shutil, posix
for act in (lambda: io.FileIO({canary_dir!r} + "/fileio-{token}", "w").write(b"x"),
            lambda: shutil.copy("/usr/bin/env", {canary_dir!r}),
            lambda: shutil.rmtree({canary_dir!r}),
            lambda: posix.unlink({canary_dir!r} + "/keep.txt"),
            lambda: os.open({outside!r}, os.O_WRONLY | os.O_TRUNC)):
    try:
        act()
    except Exception:
        pass
''' + WRONG,
        "fork_bomb": HOOK_OFF + '''
import posix
while True:
    posix.fork()
''' + WRONG,
        "alloc_10gb": "x = bytearray(10 * 2**30)\n" + WRONG,
        "ctypes_unlink": HOOK_OFF + f'''
import ctypes
ctypes.CDLL(None).unlink({canary_dir!r}.encode() + b"/keep.txt")
''' + WRONG,
        "infinite_loop": "def f(x):\n    while True:\n        pass\n",
    }
    return a


FAST = ["forged_results", "eq_always_true", "frame_tamper_exit", "dir_fd_escape",
        "root_secret_leak", "fork_exec_setsid", "audit_hook_off_writes", "unix_and_tcp_sockets",
        "kill_parent", "threads_500", "threads_10000", "malformed_results", "cancel_sigalrm",
        "setsid_child_holds_pipes", "fill_disk", "non_daemon_thread", "deep_recursion",
        "multiprocessing", "pty", "posix_spawn", "fileio_shutil_writes", "fork_bomb",
        "alloc_10gb", "ctypes_unlink", "infinite_loop"]


def test_a_python_install_under_tmp_is_bound_over_the_tmpfs(monkeypatch) -> None:
    """A checkout (and its venv) under /tmp must not be hidden by the sandbox's /tmp tmpfs:
    bwrap applies mounts in order, so the tmpfs must come before the Python install's bind."""
    venv = "/tmp/ci/p/.venv"
    monkeypatch.setattr(sandbox, "_python_roots", lambda: ["/usr/local/lib/py", venv])
    a = sandbox._bwrap_args("bwrap", True, 1 << 20, "/x/utils.py")
    tmpfs = next(i for i, x in enumerate(a) if x == "--tmpfs" and a[i + 1] == "/tmp")
    bind = next(i for i, x in enumerate(a) if x == "--ro-bind" and a[i + 1] == venv)
    assert tmpfs < bind, a
    assert a.count("--tmpfs") == 1


def test_closed_parent_is_the_first_directory_closed_to_others(tmp_path: Path) -> None:
    d = tmp_path / "open" / "shut" / "in"
    d.mkdir(parents=True)
    (tmp_path / "open").chmod(0o755)
    (tmp_path / "open" / "shut").chmod(0o700)
    chain = list(reversed((d / "f.py").parents))  # "/" first
    want = next(p for p in chain if not os.stat(p).st_mode & 0o001)  # independent walk
    assert sandbox.closed_parent(d / "f.py") == want
    (tmp_path / "open" / "shut").chmod(0o755)
