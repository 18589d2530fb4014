"""The process inside the sandbox: run one program on its inputs and print the outputs as data.

Standard library only: the sandbox binds this one file read-only and runs it as a script
(`python -I child.py < job.json`). It never sees the expected outputs and never decides a
verdict: it prints what the function returned, in a strict tagged encoding of builtin types, and
the parent (which never ran model code) compares. Anything else (a non-builtin return value, an
exception, an early exit, a hang) leaves no result and the parent scores the check as failed.
An instance of a subclass of a builtin type crosses as its base value (see `_base_value`).

The same module gives the parent the codec (`encode`, `decode`) and the audit hook
(`install_guard`), so both sides agree on one definition.

Protocol: the job comes as one JSON line on stdin, then the inputs, one encoded input per line,
each sent only once the previous one is answered (the caller times each answer itself and kills
the sandbox when an input's limit passes: the code's own timers are not the limit). The runner
keeps private dups of stdin and stdout; fds 0, 1 and 2 then point at /dev/null, so prints cannot
reach the parent. On the private stdout:
  READY_LINE   once the job is read and the guards are in place, before any program code runs
               (without it the parent reports the sandbox as broken, not the code);
  LOADED_LINE  once the program is defined (its top level ran): the first input may come;
  one line per input: {"o": <encoded output>} (the canonical run adds "t": the call's seconds,
               and "w": the seconds from having the input line to having the answer's line);
  or, ending the run, {"status": "error", "at": <input index or -1>, "kind": ...}.
The runner exits when stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

READY_LINE = b"ftbench-sandbox-ready\n"
LOADED_LINE = b"ftbench-sandbox-loaded\n"
MAX_DEPTH = 100  # nesting of returned containers; deeper values are refused, not recursed into

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
    """Add the audit hook (an inner layer only: the namespaces are what contain the code).

    It refuses fork/exec/spawn, kill, sockets, ctypes, setrlimit, and writes, deletes, renames
    or mode changes outside allowed_root. Code can defeat it (e.g. by rewriting the hook's
    __code__ through gc), which is why it is not the boundary.
    """
    import posix

    root = os.path.realpath(allowed_root)
    getcwd, join, realpath = posix.getcwd, os.path.join, os.path.realpath  # evalplus nulls some

    def inside(p: object) -> bool:
        if isinstance(p, int) or p is None:
            return True  # file descriptors: opened under the same checks
        try:
            rp = realpath(join(getcwd(), os.fsdecode(p)))
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


# ---- codec: builtin values <-> JSON; exact types only (a subclass of int is not an int) ----

class CodecError(ValueError):
    """A value that is not plain builtin data (or a malformed encoding)."""


_SCALARS = (type(None), bool, str, float)
_BIG = 10 ** 4000  # json's int <-> str conversion stops at 4300 digits; beyond, hex


def _flat(x: Any) -> bool:
    """Only scalars that JSON keeps exactly (its syntax tells int from float from bool)."""
    return all(type(v) in _SCALARS or (type(v) is int and -_BIG < v < _BIG) for v in x)


def encode(x: Any, depth: int = 0) -> Any:
    """A JSON-able form of x: scalars as themselves, containers as [tag, items]."""
    if depth > MAX_DEPTH:
        raise CodecError("nested too deeply")
    t = type(x)
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:  # hex: exact, and free of the 4300-digit str() limit
        return x if -_BIG < x < _BIG else ["I", hex(x)]
    if t is complex:
        return ["c", x.real, x.imag]
    if t is list or t is tuple or t is set or t is frozenset:
        tag = {list: "l", tuple: "t", set: "s", frozenset: "F"}[t]
        if _flat(x):  # the common big case (long lists of numbers or strings): one pass
            return [tag, list(x)]
        return [tag, [encode(v, depth + 1) for v in x]]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]]
    if t is bytes or t is bytearray:
        return ["b" if t is bytes else "B", x.hex()]
    return encode(_base_value(x), depth + 1)


# A subclass of a builtin type (collections.Counter, a namedtuple, numpy.float64, an int whose
# __eq__ always says True) crosses as its base value, read with the base type's own methods, so
# no override takes part; the parent compares that plain value. Anything else is refused.
_BASES = ((int, int.__int__), (float, float.__float__), (str, str.__str__),
          (complex, lambda v: complex(float.__float__(complex.__getattribute__(v, "real")),
                                      float.__float__(complex.__getattribute__(v, "imag")))),
          (bytes, bytes.__bytes__), (bytearray, lambda v: bytearray(bytearray.__iter__(v))),
          (dict, lambda v: dict(dict.items(v))), (list, lambda v: list(list.__iter__(v))),
          (tuple, lambda v: tuple(tuple.__iter__(v))), (set, lambda v: set(set.__iter__(v))),
          (frozenset, lambda v: frozenset(frozenset.__iter__(v))))


def _base_value(x: Any) -> Any:
    for base, read in _BASES:
        if isinstance(x, base):
            v = read(x)
            if type(v) is base:
                return v
            break
    raise CodecError(f"not builtin data: {type(x).__name__}")


def decode(j: Any, depth: int = 0) -> Any:
    """The inverse of encode; anything not produced by encode raises CodecError."""
    if depth > MAX_DEPTH:
        raise CodecError("nested too deeply")
    t = type(j)
    if j is None or t is bool or t is str or t is float or t is int:
        return j
    if t is not list or not j or type(j[0]) is not str:
        raise CodecError(f"unexpected {t.__name__}")
    tag, rest = j[0], j[1:]
    try:
        if tag == "I" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 10 ** 6:
            return int(rest[0], 16)
        if tag == "c" and len(rest) == 2 and all(type(v) is float for v in rest):
            return complex(rest[0], rest[1])
        if tag in ("b", "B") and len(rest) == 1 and type(rest[0]) is str:
            return (bytes if tag == "b" else bytearray).fromhex(rest[0])
        if len(rest) != 1 or type(rest[0]) is not list:
            raise CodecError(f"bad container {tag!r}")
        items = rest[0]
        if tag == "d":
            out = {}
            for kv in items:
                if type(kv) is not list or len(kv) != 2:
                    raise CodecError("bad dict item")
                out[decode(kv[0], depth + 1)] = decode(kv[1], depth + 1)
            return out
        if tag not in ("l", "t", "s", "F"):
            raise CodecError(f"unknown tag {tag!r}")
        vals = items if all(type(v) in _SCALARS or type(v) is int for v in items) \
            else [decode(v, depth + 1) for v in items]
        return {"l": list, "t": tuple, "s": set, "F": frozenset}[tag](vals)
    except (TypeError, ValueError, OverflowError) as e:  # unhashable key, bad hex, ...
        raise CodecError(str(e)[:80]) from None


# ---- digests: how a huge output crosses (e.g. MBPP/255's lists of 1.6 million tuples) ----
# Only for trees of exact None/int/str/list/tuple (no bool: True == 1 would not survive), where
# Python's == is exactly equality of repr(): builtin reprs, no overrides. Floats, sets, dicts,
# bytes, subclasses never digest (they cross in full).
DIGEST_NODES = 1_000_000  # outputs with more nodes than this may cross as a digest
_DIGESTIBLE = {type(None), int, str, list, tuple}
_SEQ = {list, tuple}


class Undigestible(ValueError):
    pass


def digest(x: Any) -> str:
    """sha256 of repr(x) for a digestible tree; the type scan and repr run at C speed."""
    import hashlib
    import itertools

    level = [x]
    while True:  # one level of the tree at a time: map/set/chain iterate in C
        types = set(map(type, level))
        if not types <= _DIGESTIBLE:
            raise Undigestible(", ".join(sorted(t.__name__ for t in types - _DIGESTIBLE)))
        if not types & _SEQ:
            break
        seqs = level if types <= _SEQ else [v for v in level if type(v) in _SEQ]
        level = list(itertools.chain.from_iterable(seqs))
    h = hashlib.sha256()
    if type(x) in _SEQ:  # element by element: no second copy of a huge repr
        h.update(f"{type(x).__name__}{len(x)}:".encode())
        for v in x:
            h.update(repr(v).encode("utf-8", "surrogatepass") + b"\n")
    else:
        h.update(repr(x).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _nodes_over(x: Any, limit: int) -> bool:
    """Whether x has more than limit nodes (stops counting there)."""
    n, stack = 0, [x]
    while stack:
        v = stack.pop()
        n += 1
        if n > limit:
            return True
        if type(v) in (list, tuple, set, frozenset):
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.keys())
            stack.extend(v.values())
    return False


def is_digest(j: Any) -> bool:
    return type(j) is list and len(j) == 2 and j[0] == "H" and type(j[1]) is str \
        and len(j[1]) == 64


def encode_output(x: Any, digests: bool) -> Any:
    """What crosses for one output: its encoding, or ["H", digest] when huge and allowed."""
    if digests and _nodes_over(x, DIGEST_NODES):
        try:
            return ["H", digest(x)]
        except Undigestible:
            pass
    return encode(x)


def dumps(x: Any) -> str:
    return json.dumps(encode(x), separators=(",", ":"))


def loads(s: str | bytes) -> Any:
    try:
        return decode(json.loads(s))
    except RecursionError:
        raise CodecError("nested too deeply") from None
    except ValueError as e:  # not JSON, or an int past the 4300-digit limit
        raise CodecError(f"not JSON: {str(e)[:80]}") from None


# ---- the runner ----

def _load_evalplus_utils(path: str) -> Any:
    """evalplus.eval.utils by file (its package __init__ would pull numpy into every check)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_evalplus_eval_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _send(proto: int, data: bytes) -> None:
    import posix  # the program may replace os.write; posix.write is bound here, before it runs

    view = memoryview(data)
    while view:
        view = view[posix.write(proto, view):]


def _line(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def _run(job: dict, proto: int, feed: Any) -> None:
    """Answer the inputs fed one per line until stdin closes (or an error ends the run)."""
    import copy
    import time

    send, readline, clock = _send, feed.readline, time.perf_counter  # bound before the program
    root = os.path.realpath(job.get("workdir") or os.getcwd())
    os.makedirs(root, exist_ok=True)
    os.chdir(root)
    ep = _load_evalplus_utils(job["evalplus_utils"])
    entry, code, gt = job["entry_point"], job["code"], job["mode"] == "gt"
    not_none, digests = bool(job.get("output_not_none")), bool(job.get("digests"))
    limits = job.get("time_limits") or []
    if not gt:  # evalplus's own guard for model code, exactly as its unsafe_execute applies it
        ep.reliability_guard(maximum_memory_bytes=job.get("max_memory"))
    install_guard(root)
    send(proto, READY_LINE)
    g: dict[str, Any] = {}
    try:
        with ep.swallow_io():
            exec(code, g)
            fn = g[entry]
    except BaseException:
        return send(proto, _line({"status": "error", "at": -1}))
    send(proto, LOADED_LINE)
    i = 0
    while True:
        line = readline()
        if not line:
            return None
        w0 = clock()
        inp = loads(line)
        t = None
        try:
            if gt:  # evalplus's trusted_exec: a copy of the input, wall time per call
                args = copy.deepcopy(inp)
                t0 = time.time()
                out = fn(*args)
                t = time.time() - t0
                if not_none:
                    out = out is not None
            else:
                # evalplus's in-process limit, kept so that an overrun the code lets it catch is
                # evalplus's "fail"; the limit the code cannot cancel is the caller's clock
                with ep.time_limit(limits[i]), ep.swallow_io():
                    out = fn(*inp)
                if not_none and type(out) is not bool:
                    out = out is not None  # evalplus compares only "is not None" here
        except BaseException:
            return send(proto, _line({"status": "error", "at": i, "kind": "raised"}))
        try:
            # right after the call, as evalplus compares then
            msg = {"o": encode_output(out, digests)}
        except BaseException:
            return send(proto, _line({"status": "error", "at": i, "kind": "not builtin data"}))
        if t is None:
            send(proto, _line(msg))
        else:  # the canonical run: the call, and all this input cost, its line's encoding too
            msg["t"] = t
            data = _line(msg)
            send(proto, data[:-2] + b',"w":' + repr(float(clock() - w0)).encode() + b"}\n")
        i += 1


def main() -> None:
    proto = os.dup(1)
    feed = os.fdopen(os.dup(0), "rb", buffering=1 << 16)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        _run(json.loads(feed.readline()), proto, feed)
    except BaseException:
        try:
            _send(proto, b'{"status":"error","at":-1}\n')
        except BaseException:
            pass
    os._exit(0)  # no waiting for threads the program left behind


if __name__ == "__main__":
    main()
