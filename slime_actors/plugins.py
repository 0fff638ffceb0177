"""Load user functions named on the command line (--custom-rm-path, --custom-generate-function-path,
--rollout-function-path, --dynamic-sampling-filter-path).

    fn = load_function("my_pkg.rewards.score")               # a dotted path: module, then attribute(s)
    fn = load_function("my_pkg.rewards:Scorer.score")        # module:attribute, explicit split
    fn = load_function("my_rewards/score.py:score")          # a Python file and a name in it

A dotted path is split at the longest importable module ("a.b.C.f" imports a.b and takes C.f), so attributes of
classes work too. A file path is loaded once (by absolute path) as module `slime_actors_plugin_<stem>_<hash>`
and registered in sys.modules. Results are cached; `clear_cache()` forgets them.

Errors are `PluginError` (an ImportError) with `kind` telling what went wrong:
  "bad_path"         the string is empty or malformed
  "module_not_found" no module of that name (or no such file) — the message says what was looked for
  "import_failed"    the module exists but importing it raised (including a missing dependency *inside* it)
  "attribute_missing" the module imported but has no such attribute (the message lists close names)
  "not_callable"     the attribute exists but cannot be called
Pass `flag="--custom-rm-path"` to have the message name the flag the path came from.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
from typing import Any, Callable

__all__ = ["PluginError", "load_function", "maybe_load_function", "clear_cache", "positional_arity", "takes_keyword"]

_cache: dict[str, Callable] = {}
_lock = threading.RLock()


class PluginError(ImportError):
    """A user function could not be loaded; `kind` says why, `path` is what was asked for."""

    def __init__(self, message: str, *, kind: str, path: str):
        super().__init__(message)
        self.kind = kind
        self.path = path


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def maybe_load_function(path: str | None, flag: str | None = None) -> Callable | None:
    """`load_function(path)`, or None when no path is given (an unset optional flag)."""
    if path is None or (isinstance(path, str) and not path.strip()):
        return None
    return load_function(path, flag=flag)


def load_function(path: str, flag: str | None = None) -> Callable:
    """The callable named by `path`: "pkg.module.fn", "pkg.module:fn" or "path/to/file.py:fn"."""
    if not isinstance(path, str) or not path.strip():
        raise PluginError(f"{_where(flag)}expected a function path like 'pkg.module.fn' or 'file.py:fn', "
                          f"got {path!r}", kind="bad_path", path=str(path))
    path = path.strip()
    with _lock:
        if path in _cache:
            return _cache[path]
        fn = _load(path, flag)
        _cache[path] = fn
        return fn


def _where(flag: str | None) -> str:
    return f"{flag}: " if flag else ""


def _load(path: str, flag: str | None) -> Callable:
    w = _where(flag)
    if ":" in path:
        left, _, attr = path.rpartition(":")
        if not left or not attr:
            raise PluginError(f"{w}{path!r}: expected 'module:function' or 'file.py:function'",
                              kind="bad_path", path=path)
        if left.endswith(".py") or os.sep in left or "/" in left:
            module, where = _import_file(left, path, w), f"file {left}"
        else:
            module, where = _import_module(left, path, w), f"module {left!r}"
        obj = _get_attr(module, attr, path, where, w)
    else:
        if path.endswith(".py"):
            raise PluginError(f"{w}{path!r} names a file but no function: write '{path}:function_name'",
                              kind="bad_path", path=path)
        parts = path.split(".")
        if len(parts) < 2 or not all(p.isidentifier() for p in parts):
            raise PluginError(f"{w}{path!r} is not a dotted path like 'pkg.module.function'",
                              kind="bad_path", path=path)
        module, split = None, 0
        # longest importable prefix: "a.b.C.f" -> import a.b, then getattr C, f
        for split in range(len(parts) - 1, 0, -1):
            name = ".".join(parts[:split])
            module = _try_import(name, path, w)
            if module is not None:
                break
        if module is None:
            top = parts[0]
            raise PluginError(
                f"{w}cannot load {path!r}: module {'.'.join(parts[:-1])!r} not found "
                f"(no module named {top!r} is importable either; is its directory on PYTHONPATH? "
                f"a file can be named as 'path/to/file.py:function')",
                kind="module_not_found", path=path)
        rest = parts[split:]
        if len(rest) > 1 and not hasattr(module, rest[0]):
            # "pkg.mod.fn" with pkg importable but no pkg.mod: report the module, not the attribute
            raise PluginError(f"{w}cannot load {path!r}: module {'.'.join(parts[:-1])!r} not found "
                              f"({module.__name__!r} has no submodule or attribute {rest[0]!r})",
                              kind="module_not_found", path=path)
        obj = _get_attr(module, ".".join(rest), path, f"module {'.'.join(parts[:split])!r}", w)
    if not callable(obj):
        raise PluginError(f"{w}{path!r} is a {type(obj).__name__}, not a function (not callable)",
                          kind="not_callable", path=path)
    return obj


def _try_import(name: str, path: str, w: str):
    """The module, None if `name` (or a parent package of it) does not exist; PluginError if importing fails."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            return None  # the module itself (or its package) is absent
        raise PluginError(f"{w}cannot load {path!r}: importing module {name!r} failed: it imports "
                          f"{missing!r}, which is not installed ({exc})", kind="import_failed", path=path) from exc
    except Exception as exc:
        raise PluginError(f"{w}cannot load {path!r}: importing module {name!r} raised "
                          f"{type(exc).__name__}: {exc}", kind="import_failed", path=path) from exc


def _import_module(name: str, path: str, w: str):
    if not all(p.isidentifier() for p in name.split(".")):
        raise PluginError(f"{w}{path!r}: {name!r} is not a module name", kind="bad_path", path=path)
    module = _try_import(name, path, w)
    if module is None:
        raise PluginError(f"{w}cannot load {path!r}: module {name!r} not found (is its directory on PYTHONPATH?)",
                          kind="module_not_found", path=path)
    return module


def _import_file(file: str, path: str, w: str):
    full = os.path.abspath(os.path.expanduser(file))
    if not os.path.isfile(full):
        raise PluginError(f"{w}cannot load {path!r}: file {full} not found", kind="module_not_found", path=path)
    stem = os.path.splitext(os.path.basename(full))[0]
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in stem)
    modname = f"slime_actors_plugin_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:10]}"
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, full)
    if spec is None or spec.loader is None:
        raise PluginError(f"{w}cannot load {path!r}: {full} is not a Python module", kind="import_failed",
                          path=path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(modname, None)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise PluginError(f"{w}cannot load {path!r}: executing {full} raised {type(exc).__name__}: {exc}",
                          kind="import_failed", path=path) from exc
    return module


def _get_attr(module: Any, dotted: str, path: str, where: str, w: str):
    obj = module
    for i, name in enumerate(dotted.split(".")):
        if not name.isidentifier():
            raise PluginError(f"{w}{path!r}: {dotted!r} is not an attribute name", kind="bad_path", path=path)
        try:
            obj = getattr(obj, name)
        except AttributeError:
            owner = where if i == 0 else repr(".".join(dotted.split(".")[:i]))
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise PluginError(f"{w}cannot load {path!r}: {owner} has no attribute {name!r}{hint}",
                              kind="attribute_missing", path=path) from None
    return obj


def positional_arity(fn: Callable) -> tuple[int, int | None]:
    """(required, most) positional parameters of `fn`; most is None with *args. (0, None) when the signature
    cannot be read (a builtin): the caller then cannot tell how to call it."""
    import inspect
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 0, None
    required, most = 0, 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            most += 1
            if p.default is p.empty:
                required += 1
        elif p.kind == p.VAR_POSITIONAL:
            most = None
            break
    return required, most


def takes_keyword(fn: Callable, name: str) -> bool:
    """Whether `fn` accepts the keyword argument `name` (slime passes `evaluation=` to functions that name it)."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    return (p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or any(
        q.kind == q.VAR_KEYWORD for q in params.values())


# -- before a job starts: the path checked without running any code --------------------------------------------

def check_function_path(path: str, flag: str | None = None) -> str | None:
    """Why `path` cannot name a function, found without importing anything (the launcher's check before any
    process starts; the plug-in's own code runs only in the actor that uses it): a file or module that is not
    there, a Python file that does not parse, a name its top level does not define. None when it looks loadable
    (a module that defines `__getattr__` or star-imports may define any name: not judged here). Modules are
    looked for where an actor process finds them: the current directory, then sys.path."""
    import ast
    w = _where(flag)
    if not isinstance(path, str) or not path.strip():
        return f"{w}expected a function path like 'pkg.module.fn' or 'file.py:fn', got {path!r}"
    path = path.strip()
    if ":" in path:
        left, _, attr = path.rpartition(":")
        if not left or not attr:
            return f"{w}{path!r}: expected 'module:function' or 'file.py:function'"
        if left.endswith(".py") or os.sep in left or "/" in left:
            full = os.path.abspath(os.path.expanduser(left))
            if not os.path.isfile(full):
                return f"{w}cannot load {path!r}: file {full} not found"
            return _check_source(full, attr.split(".")[0], path, w, ast)
        origin, rest = _find_module(left), attr.split(".")
        if origin is None:
            return f"{w}cannot load {path!r}: module {left!r} not found (is its directory on PYTHONPATH?)"
    else:
        if path.endswith(".py"):
            return f"{w}{path!r} names a file but no function: write '{path}:function_name'"
        parts = path.split(".")
        if len(parts) < 2 or not all(p.isidentifier() for p in parts):
            return f"{w}{path!r} is not a dotted path like 'pkg.module.function'"
        origin, rest = None, []
        for split in range(len(parts) - 1, 0, -1):
            origin = _find_module(".".join(parts[:split]))
            if origin is not None:
                rest = parts[split:]
                break
        if origin is None:
            return (f"{w}cannot load {path!r}: module {'.'.join(parts[:-1])!r} not found (is its directory on "
                    "PYTHONPATH? a file can be named as 'path/to/file.py:function')")
    if not origin.endswith(".py"):
        return None   # a compiled or built-in module: not read here
    return _check_source(origin, rest[0], path, w, ast)


def _find_module(name: str) -> str | None:
    """The file of module `name` (its package's __init__.py; "" for one with no file), or None when there is none
    -- found by the import system's path finder, parents included, without importing anything."""
    from importlib.machinery import PathFinder
    if name in sys.modules:
        return getattr(sys.modules[name], "__file__", None) or ""
    search: list[str] | None = [os.getcwd(), *sys.path]
    spec = None
    for part in name.split("."):
        if not part.isidentifier() or search is None:
            return None
        spec = PathFinder.find_spec(part, search)
        if spec is None:
            if part == name and importlib.util.find_spec(part) is not None:   # a built-in module
                return ""
            return None
        search = list(spec.submodule_search_locations) if spec.submodule_search_locations else None
    return spec.origin or "" if spec is not None else None


def _check_source(file: str, name: str, path: str, w: str, ast) -> str | None:
    try:
        with open(file, "rb") as f:
            tree = ast.parse(f.read(), filename=file)
    except SyntaxError as exc:
        return f"{w}cannot load {path!r}: {file} line {exc.lineno}: {exc.msg}"
    except (OSError, ValueError) as exc:
        return f"{w}cannot load {path!r}: cannot read {file}: {exc}"
    except (RecursionError, MemoryError):   # (an expression nested deeper than Python's parser goes: import fails too)
        return f"{w}cannot load {path!r}: {file}: nested too deep for Python's parser"
    defined: set[str] = set()
    todo = list(tree.body)
    while todo:   # the module's top level, through if / try / with blocks (definitions made conditionally count)
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None   # star-imported names are not known without importing
                defined.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.Assign):
            defined.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for attr in ("body", "orelse", "finalbody"):
                todo.extend(getattr(node, attr, []))
            for h in getattr(node, "handlers", []):
                todo.extend(h.body)
    if name in defined or "__getattr__" in defined:
        return None
    if os.path.basename(file) == "__init__.py" and _find_module_in(os.path.dirname(file), name):
        return None   # a submodule of the package
    close = difflib.get_close_matches(name, sorted(defined), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{w}cannot load {path!r}: {file} defines no {name!r}{hint}"


def _find_module_in(directory: str, name: str) -> bool:
    return os.path.isfile(os.path.join(directory, name + ".py")) or os.path.isdir(os.path.join(directory, name))
