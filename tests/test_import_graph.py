"""The package's layers point one way (issue 20): every `import` in slime_actors/ -- at module level or inside a
function, read with ast, nothing imported -- makes a graph of modules, and

* it has no cycle (train.py <-> launch/job.py was one);
* mailbox/, algo/ and backends/ import nothing from actors/, launch/ or traces/ (the mailbox imported the trace
  writer; a backend read a launcher constant);
* config.py imports none of the package's subpackages (it reached into backends/sglang_launch.py);
* no module of actors/ imports a role's module (the buffer and the controller imported checkpoint helpers from
  actors/trainer.py), and no module of launch/ imports another module's private names (torchrun imported job.py's
  `_keys` and `_runtime`).

Each rule is a function returning what breaks it; the tests run them on the package, and on a copy of it with one
violation put in, to show that they catch it."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "slime_actors"
LOWER = ("mailbox", "algo", "backends")          # ... never import from:
UPPER = ("actors", "launch", "traces")
ROLE_MODULES = {"directory", "controller", "buffer", "rollout", "reward", "trainer"}   # actors/<role>.py or <role>/


def modules(root: Path) -> dict[str, Path]:
    """slime_actors.x.y -> its file, for every .py file under `root` (the package directory)."""
    out = {}
    for p in root.rglob("*.py"):
        parts = [root.name, *p.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(root: Path) -> dict[str, dict[str, list[str]]]:
    """module -> {imported module of the package: [the names taken from it, '*' for a plain import]}."""
    mods = modules(root)
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in mods}
    for mod, path in mods.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            found: list[tuple[str, str]] = []
            if isinstance(node, ast.Import):
                found = [(a.name, "*") for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                found = [(f"{base}.{a.name}", "*") if f"{base}.{a.name}" in mods else (base, a.name)
                         for a in node.names]
            for target, name in found:
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in mods and target != mod:
                    graph[mod].setdefault(target, []).append(name)
    return graph


def _import_nodes(tree: ast.AST):
    """Every import statement, those inside functions too; not those under `if TYPE_CHECKING:` (annotations only,
    never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def layer(mod: str) -> str:
    """slime_actors.backends.weight_sync -> backends; slime_actors.train -> train."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


# ---------------------------------------------------------------------------------------------------- the rules

def cycles(graph) -> list[list[str]]:
    """One cycle per strongly connected group of modules (a path that comes back to its start)."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, g) for g in groups]


def _cycle_in(graph, group: set[str]) -> list[str]:
    start = min(group)
    path, seen, v = [start], {start}, start
    while True:  # every member reaches the others inside the group: walk until a module repeats
        v = next(w for w in sorted(graph[v]) if w in group)
        if v in seen:
            return path[path.index(v):] + [v]
        path.append(v)
        seen.add(v)


def upward(graph) -> list[str]:
    return [f"{a} imports {b}" for a, ts in graph.items() for b in ts
            if layer(a) in LOWER and layer(b) in UPPER]


def reaches(graph, a: str, b: str) -> bool:
    todo, seen = [a], {a}
    while todo:
        for w in graph[todo.pop()]:
            if w == b:
                return True
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return False


def config_reaches_out(graph) -> list[str]:
    return [f"slime_actors.config imports {b}" for b in graph["slime_actors.config"]
            if b.count(".") > 1 or layer(b) in (*LOWER, *UPPER)]


def role_of(mod: str) -> str | None:
    """slime_actors.actors.trainer -> trainer; slime_actors.actors.controller.engines -> controller (a role's
    package); None for the actors' shared modules (base, host, ...)."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "actors" and parts[2] in ROLE_MODULES else None


def roles_imported(graph) -> list[str]:
    return [f"{a} imports {b}" for a, ts in graph.items() for b in ts
            if layer(a) == "actors" and role_of(b) is not None and role_of(b) != role_of(a)]


def launch_privates(graph) -> list[str]:
    return [f"{a} imports {b}.{n}" for a, ts in graph.items() for b, names in ts.items() for n in names
            if layer(a) == "launch" and n.startswith("_") and not n.startswith("__")]


RULES = {"cycles": cycles, "upward": upward, "config": config_reaches_out, "roles": roles_imported,
         "launch_privates": launch_privates}


# ---------------------------------------------------------------------------------------------------- the package

@pytest.fixture(scope="module")
def graph():
    return imports(PKG)


def test_the_graph_is_read(graph):
    # what the rules stand on: relative, absolute and in-function imports, submodules taken from a package
    assert "slime_actors.launch.job" in graph["slime_actors.train"]                 # from .launch.job import ...
    assert "slime_actors.backends.weight_sync" in graph["slime_actors.actors.trainer"]   # in a function
    assert "slime_actors.actors.base" in graph["slime_actors.actors.buffer"]
    assert graph["slime_actors.launch.actor"]["slime_actors.env"] == ["*"]          # from .. import env as E


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_package_keeps_the_rule(graph, rule):
    assert RULES[rule](graph) == []


def test_no_train_launch_job_cycle(graph):
    assert not reaches(graph, "slime_actors.launch.job", "slime_actors.train")


# ---------------------------------------------------------------------------------------------------- the rules work

VIOLATIONS = {  # rule: (file, line appended to it, what the rule must report)
    "cycles": ("launch/job.py", "from ..train import main", "slime_actors.launch.job -> slime_actors.train"),
    "upward": ("mailbox/mailbox.py", "from ..traces.writer import fast_entries",
               "slime_actors.mailbox.mailbox imports slime_actors.traces.writer"),
    "config": ("config.py", "from .backends.sglang_launch import check_engine_flags",
               "slime_actors.config imports slime_actors.backends.sglang_launch"),
    "roles": ("actors/buffer.py", "from .trainer import reachable_address",
              "slime_actors.actors.buffer imports slime_actors.actors.trainer"),
    "launch_privates": ("launch/torchrun.py", "from .job import _install_signals",
                        "slime_actors.launch.torchrun imports slime_actors.launch.job._install_signals"),
}


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    dst = tmp_path_factory.mktemp("pkg") / "slime_actors"
    shutil.copytree(PKG, dst, ignore=lambda d, names: [n for n in names if not (n.endswith(".py") or
                                                                                (Path(d) / n).is_dir())])
    return dst


@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_each_rule_catches_a_violation(copy, rule):
    rel, line, expect = VIOLATIONS[rule]
    f = copy / rel
    before = f.read_text()
    try:
        f.write_text(before + "\n\ndef _added():\n    " + line + "\n")
        found = RULES[rule](imports(copy))
    finally:
        f.write_text(before)
    assert any(expect in (v if isinstance(v, str) else " -> ".join(v)) for v in found), found


def test_an_import_for_annotations_only_is_no_edge(copy):
    f = copy / "mailbox" / "mailbox.py"
    before = f.read_text()
    try:
        f.write_text(before + "\nif TYPE_CHECKING:\n    from ..traces.writer import TraceWriter\n")
        assert upward(imports(copy)) == []
    finally:
        f.write_text(before)
