"""The harness that grades a program against assert-style tests inside the sandbox (standard library only).

The jail (jail.py, "harness" mode) runs `main(args)` in the cell's program process, which becomes two:

  tester   this process. It forks the solver FIRST, makes itself undumpable (no other process of the cell may read
           its memory, its fds or its environment; seccomp refuses ptrace and process_vm_readv besides), and only
           then reads from stdin what the grader sends: a token, the setup code and the tests. It runs the tests
           with the real builtins; the solver's functions, classes and values reach it through proxies. When the
           tests have run it writes ONE line to a private copy of its stdout: "<token> <json verdict>".
  solver   the model's program (`args["solution"]`, a file of the working directory), run as module `solution`
           with stdin and stdout on /dev/null. It answers the tester's requests: call a function (or a method of an
           object it holds), read an attribute, list an iterable. Arguments and results cross as plain data only
           (None, bool, int, float, complex, str, bytes and lists, tuples, dicts, sets, frozensets of them -- exact
           types, no subclasses); anything else stays in the solver and the tester gets a handle to it.

So the model's program never sees the tests, their expected values or the token, and nothing it does -- print
"PASS", exit 0 early, patch builtins or sys.exit, return an object whose __eq__ says yes, kill the tester -- can
produce the token line: the worst it can do is fail. A test that times out, or a solver that dies, fails that test
and every one after it.
"""

import base64
import builtins
import ctypes
import json
import os
import select
import struct
import sys
import time
import types

MAX_MESSAGE = 16 << 20
MAX_DEPTH = 200
_LEN = struct.Struct(">I")


class Unencodable(Exception):
    pass


class SolverGone(BaseException):
    """The solver ended or did not answer in time: this test and the rest fail (not catchable by `except
    Exception` in a test)."""


class RemoteError(Exception):
    """An exception of the solver that is not a built-in one (its type name and message)."""


# ------------------------------------------------------------------------------------------------ plain data
def encode(x, refs=None, depth=0):
    """`x` as JSON-able tagged data; Unencodable for anything but plain data (exact types)."""
    if depth > MAX_DEPTH:
        raise Unencodable("nested too deep")
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return x if -(1 << 53) < x < (1 << 53) else {"i": str(x)}
    if t is float:
        return {"x": repr(x)} if x != x or x in (float("inf"), float("-inf")) else x
    if t is complex:
        return {"c": [encode(x.real), encode(x.imag)]}
    if t is bytes:
        return {"b": base64.b64encode(x).decode()}
    if t is list:
        return {"l": [encode(v, refs, depth + 1) for v in x]}
    if t is tuple:
        return {"t": [encode(v, refs, depth + 1) for v in x]}
    if t is set:
        return {"s": [encode(v, refs, depth + 1) for v in x]}
    if t is frozenset:
        return {"f": [encode(v, refs, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[encode(k, refs, depth + 1), encode(v, refs, depth + 1)] for k, v in x.items()]}
    if refs is not None and t is Remote:
        return {"r": object.__getattribute__(x, "_ref")}
    raise Unencodable(t.__name__)


def decode(x, resolve=None):
    if not isinstance(x, dict):
        return x
    (tag, v), = x.items()
    if tag == "i":
        return int(v)
    if tag == "x":
        return float(v)
    if tag == "c":
        return complex(decode(v[0]), decode(v[1]))
    if tag == "b":
        return base64.b64decode(v)
    if tag == "l":
        return [decode(e, resolve) for e in v]
    if tag == "t":
        return tuple(decode(e, resolve) for e in v)
    if tag == "s":
        return {decode(e, resolve) for e in v}
    if tag == "f":
        return frozenset(decode(e, resolve) for e in v)
    if tag == "d":
        return {decode(k, resolve): decode(val, resolve) for k, val in v}
    if tag == "r" and resolve is not None:
        return resolve(v)
    raise ValueError(f"unknown tag {tag!r}")


# ------------------------------------------------------------------------------------------------ framing
def _send(fd, obj):
    data = json.dumps(obj).encode()
    if len(data) > MAX_MESSAGE:
        data = json.dumps({"raise": ["ValueError", f"message of {len(data)} bytes is too large"]}).encode()
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, n, deadline):
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SolverGone("no answer in time")
        chunk = os.read(fd, min(n - len(buf), 1 << 16))
        if not chunk:
            raise SolverGone("the program ended")
        buf += chunk
    return bytes(buf)


def _recv(fd, deadline=None):
    (n,) = _LEN.unpack(_read_exact(fd, _LEN.size, deadline))
    if n > MAX_MESSAGE:
        raise SolverGone(f"a message of {n} bytes")
    return json.loads(_read_exact(fd, n, deadline))


# ------------------------------------------------------------------------------------------------ the solver
def _solver(args, req, resp):
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    keep = {0, 1, 2, req, resp}
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    handles = {}

    def resolve(ref):
        if ref not in handles:
            raise ValueError(f"no object {ref}")
        return handles[ref]

    def wrap(value):
        try:
            return {"value": encode(value)}
        except (Unencodable, RecursionError):
            ref = len(handles) + 1
            handles[ref] = value
            return {"handle": ref, "type": type(value).__name__, "callable": callable(value)}

    ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        with open(args.get("solution", "solution.py"), "rb") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), ns)
    except BaseException as e:   # noqa: BLE001 -- the program failed to load: say so, and end
        _send(resp, {"load_error": f"{type(e).__name__}: {str(e)[:500]}"})
        os._exit(1)
    handles[0] = ns
    names = {}
    for k, v in list(ns.items()):
        if k.startswith("__") or isinstance(v, types.ModuleType):
            continue
        names[k] = wrap(v)
    _send(resp, {"names": names})
    while True:
        try:
            msg = _recv(req)
        except (SolverGone, ValueError):
            os._exit(0)
        try:
            target = resolve(msg["ref"])
            op = msg["op"]
            if op == "call":
                a = decode({"t": msg["args"]}, resolve)
                kw = decode({"d": msg["kwargs"]}, resolve)
                reply = wrap(target(*a, **kw))
            elif op == "getattr":
                reply = wrap(getattr(target, msg["name"]))
            elif op == "iter":
                reply = wrap(list(target))
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as e:   # noqa: BLE001 -- the program's exception goes to the test
            reply = {"raise": [type(e).__name__, str(e)[:1000]]}
        _send(resp, reply)


# ------------------------------------------------------------------------------------------------ the tester
class _Link:
    def __init__(self, req, resp, deadline):
        self.req, self.resp, self.deadline = req, resp, deadline
        self.gone = None

    def ask(self, msg):
        if self.gone:
            raise SolverGone(self.gone)
        try:
            _send(self.req, msg)
            reply = _recv(self.resp, self.deadline)
        except (OSError, SolverGone, ValueError) as e:
            self.gone = str(e) or type(e).__name__
            raise SolverGone(self.gone) from None
        return self.result(reply)

    def result(self, reply):
        if "raise" in reply:
            name, text = reply["raise"]
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception) and cls is not SystemExit:
                try:
                    raise cls(text)
                except TypeError:
                    pass
            raise RemoteError(f"{name}: {text}")
        if "handle" in reply:
            return Remote(self, reply["handle"], reply.get("type", "object"))
        return decode(reply["value"])


class Remote:
    """A function, class or object that lives in the solver: call it, read its attributes, iterate it."""
    __slots__ = ("_link", "_ref", "_type")

    def __init__(self, link, ref, type_name):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *a, **kw):
        link = object.__getattribute__(self, "_link")
        try:
            args = encode(a, refs=True)["t"]
            kwargs = encode(dict(kw), refs=True)["d"]
        except Unencodable as e:
            raise TypeError(f"an argument of type {e} cannot be passed to the program") from None
        return link.ask({"op": "call", "ref": object.__getattribute__(self, "_ref"), "args": args,
                         "kwargs": kwargs})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        link = object.__getattribute__(self, "_link")
        return link.ask({"op": "getattr", "ref": object.__getattribute__(self, "_ref"), "name": name})

    def __iter__(self):
        link = object.__getattribute__(self, "_link")
        return iter(link.ask({"op": "iter", "ref": object.__getattribute__(self, "_ref")}))

    def __repr__(self):
        return f"<{object.__getattribute__(self, '_type')} of the program>"


def _undumpable():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)      # PR_SET_DUMPABLE 0
    except (OSError, AttributeError):
        pass


def main(args):
    deadline = time.monotonic() + float(args.get("deadline", 10.0))
    _undumpable()
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        os.close(resp_r)
        try:
            _solver(args, req_r, resp_w)
        finally:
            os._exit(1)
    os.close(req_r)
    os.close(resp_w)
    verdict_fd = os.dup(1)
    os.dup2(2, 1)                  # what the tests print goes to stderr; stdout carries only the verdict
    payload = json.loads(sys.stdin.buffer.read() or b"{}")
    token = str(payload.get("token", ""))
    tests = [str(t) for t in payload.get("tests", [])]
    link = _Link(req_w, resp_r, deadline)
    verdict = {"passed": [False] * len(tests), "errors": [None] * len(tests)}
    try:
        hello = _recv(resp_r, deadline)
    except (SolverGone, ValueError) as e:
        hello = {"load_error": f"the program did not load: {e}"}
    if "load_error" in hello:
        verdict["load_error"] = hello["load_error"]
    else:
        ns = {"__name__": "__tests__", "__builtins__": builtins}
        for name, reply in hello.get("names", {}).items():
            try:
                ns[name] = link.result(reply)
            except Exception:   # noqa: BLE001
                pass
        setup = str(payload.get("setup") or "")
        try:
            if setup:
                exec(compile(setup, "setup", "exec"), ns)
            for i, test in enumerate(tests):
                try:
                    exec(compile(test, f"test_{i}", "exec"), ns)
                    verdict["passed"][i] = True
                except SolverGone as e:
                    verdict["errors"][i] = f"the program stopped answering: {e}"
                    verdict["gone"] = str(e)
                    break
                except AssertionError as e:
                    verdict["errors"][i] = f"AssertionError: {str(e)[:200]}"
                except Exception as e:   # noqa: BLE001
                    verdict["errors"][i] = f"{type(e).__name__}: {str(e)[:200]}"
        except SolverGone as e:
            verdict["gone"] = str(e)
        except Exception as e:   # noqa: BLE001
            verdict["setup_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if verdict.get("gone") and time.monotonic() >= deadline - 0.01:
        verdict["timed_out"] = True
    try:
        os.kill(pid, 9)
    except OSError:
        pass
    line = (token + " " + json.dumps(verdict) + "\n").encode()
    view = memoryview(line)
    while view:
        view = view[os.write(verdict_fd, view):]
    return 0
