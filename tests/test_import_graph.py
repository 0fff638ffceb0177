"""The package's layers point one way (issues 20, 29): every `import` in slime_actors/ -- at module level or inside a
function, read with ast, nothing imported -- makes a graph of modules, and

* it has no cycle (train.py <-> launch/job.py was one), and no two rooms import each other through any others (a
  room: a subpackage, or a module at the package's top; backends/ <-> checkpoints.py was such a circle);
* every room is on a floor (FLOORS, the same as docs/architecture.md's "Layers"), and no module imports one of a
  room on a higher floor, but for at most two arrows named in ALLOWED_UP with the reason (the actors imported the
  trace writer from the tools folder, the trainer the launcher's StartupError, the buffer a CLI module);
* the mailbox imports nothing above the ground floor: it takes its tracer as a plug-in (mailbox/tracing.py);
* config.py imports none of the package's subpackages (it reached into backends/sglang_launch.py);
* no module of actors/ imports a role's module (the buffer and the controller imported checkpoint helpers from
  actors/trainer.py), and no module of launch/ imports another module's private names (torchrun imported job.py's
  `_keys` and `_runtime`).

Each rule is a function returning what breaks it; the tests run them on the package, and on a copy of it with one
violation put in, to show that they catch it. `python tests/test_import_graph.py [PACKAGE_DIR]` prints the numbers
(rooms, floors, arrows back up, circles)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "slime_actors"
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
    """The module's room: slime_actors.backends.weight_sync -> backends; slime_actors.train -> train."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


# The floors, bottom up: every room (a subpackage, or a module at the package's top) on one floor; a room imports
# rooms of its own floor or below (docs/architecture.md, "Layers"). An import of a room above is an arrow back up.
FLOORS: dict[str, tuple[str, ...]] = {
    "ground": ("slime_actors", "env", "log", "types", "rows", "retry", "slime_compat", "plugins", "gpus",
               "startup_timeline", "json_files", "http_answers", "loop_turns"),
    "wire and config": ("mailbox", "recorder", "messages", "handles", "role_handles", "runtime", "profiler",
                        "gpu_memory", "heapwatch",
                        "gc_watch", "config",
                        "hack_thresholds",
                        "models"),
    "work": ("algo", "backends", "checkpoints", "safe_pickle", "run_dir", "data", "filters", "rewards", "sandbox",
             "search", "environments", "agents", "episode_samples", "monitor", "eval_config", "buffer_state",
             "sample_display", "metric_sinks",
             "tb_writer", "plots", "tokenizer"),
    "roles": ("actors",),
    "launch": ("launch", "train"),
    "tools": ("traces",),
    "commands": ("samples", "cli", "convert", "flags_doc", "demo"),
}
# the arrows back up there are, each with why (at most 2)
ALLOWED_UP: dict[str, str] = {}


def floor_of(room: str, floors: dict[str, tuple[str, ...]] = FLOORS) -> int:
    for i, rooms in enumerate(floors.values()):
        if room in rooms:
            return i
    raise KeyError(f"room {room!r} is on no floor: put it in FLOORS (tests/test_import_graph.py) and in "
                   "docs/architecture.md's Layers")


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


def rooms_graph(graph) -> dict[str, dict[str, list[str]]]:
    """room -> {another room it imports: [the module imports that make the arrow]}."""
    out: dict[str, dict[str, list[str]]] = {layer(m): {} for m in graph}
    for a, ts in graph.items():
        for b in ts:
            if layer(a) != layer(b):
                out[layer(a)].setdefault(layer(b), []).append(f"{a} imports {b}")
    return out


def arrows_up(graph, floors: dict[str, tuple[str, ...]] = FLOORS) -> list[str]:
    """Every import of a module on a higher floor than the importer's."""
    return [f"{a} imports {b}" for a, ts in graph.items() for b in ts
            if floor_of(layer(a), floors) < floor_of(layer(b), floors)]


def upward(graph) -> list[str]:
    """The arrows back up, but those ALLOWED_UP names (with why)."""
    return [x for x in arrows_up(graph) if x not in ALLOWED_UP]


def room_cycles(graph) -> list[list[str]]:
    """Circles between rooms: a room importing one that imports it back (through any others)."""
    return cycles(rooms_graph(graph))


def unplaced(graph) -> list[str]:
    return sorted({layer(m) for m in graph if not any(layer(m) in rooms for rooms in FLOORS.values())})


def mailbox_plugins(graph) -> list[str]:
    """The mailbox takes its tracer as a plug-in (mailbox/tracing.py declares what it needs): it imports nothing of
    the recorder, nor of anything above the wire."""
    return [f"{a} imports {b}" for a, ts in graph.items() for b in ts
            if layer(a) == "mailbox" and layer(b) not in FLOORS["ground"] + ("mailbox",)]


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
            if b.count(".") > 1 or (b != "slime_actors" and any(m.startswith(b + ".") for m in graph))]
    # a subpackage, or a module in one (the package's own __init__, its version, is ground)


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


RULES = {"cycles": cycles, "upward": upward, "room_cycles": room_cycles, "unplaced": unplaced,
         "mailbox_plugins": mailbox_plugins, "config": config_reaches_out, "roles": roles_imported,
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
    assert graph["slime_actors.actors.trainer"]["slime_actors.recorder.environment"] == ["*"]   # from ..recorder import environment


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_package_keeps_the_rule(graph, rule):
    assert RULES[rule](graph) == []


def test_at_most_two_arrows_back_up_are_allowed_and_each_says_why(graph):
    assert len(ALLOWED_UP) <= 2
    assert all(why.strip() for why in ALLOWED_UP.values())
    assert set(ALLOWED_UP) <= set(arrows_up(graph)), "an allowed arrow that is no longer there: take it out"


def test_each_room_is_on_one_floor():
    rooms = [r for rs in FLOORS.values() for r in rs]
    assert len(rooms) == len(set(rooms)), [r for r in rooms if rooms.count(r) > 1]


def test_a_new_room_must_be_placed(copy):
    (copy / "newroom.py").write_text("X = 1\n")
    try:
        assert unplaced(imports(copy)) == ["newroom"]
    finally:
        (copy / "newroom.py").unlink()


def test_the_docs_list_the_floors():
    # docs/architecture.md, "Layers": one line a floor, bottom first, naming its rooms
    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    for name, rooms in FLOORS.items():
        line = next((ln for ln in section.splitlines() if ln.startswith(f"| {name} |")), None)
        assert line is not None, f"docs/architecture.md Layers: no line for the floor {name!r}"
        for room in rooms:
            assert f"`{room}" in line, f"docs/architecture.md Layers: {room!r} not on the line of {name!r}"


def test_no_train_launch_job_cycle(graph):
    assert not reaches(graph, "slime_actors.launch.job", "slime_actors.train")


# ---------------------------------------------------------------------------------------------------- the rules work

VIOLATIONS = {  # rule: (file, line appended to it, what the rule must report)
    "cycles": ("launch/job.py", "from ..train import main", "slime_actors.launch.job -> slime_actors.train"),
    "upward": ("actors/trainer.py", "from ..launch.startup import cause_of",
               "slime_actors.actors.trainer imports slime_actors.launch.startup"),
    "room_cycles": ("checkpoints.py", "from .backends.hf_export import export_hf",
                    "backends -> checkpoints -> backends"),
    "mailbox_plugins": ("mailbox/mailbox.py", "from ..recorder.writer import TraceWriter",
                        "slime_actors.mailbox.mailbox imports slime_actors.recorder.writer"),
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
        f.write_text(before + "\nif TYPE_CHECKING:\n    from ..traces.reader import TraceRun\n")
        assert upward(imports(copy)) == []
    finally:
        f.write_text(before)


# ---------------------------------------------------------------------------------------------------- measuring

def measure(root: Path, floors: dict[str, tuple[str, ...]] = FLOORS) -> dict:
    """The house as numbers: rooms (subpackages and top-level modules; packages: the subpackages), floors, the
    arrows back up (module imports, and the pairs of rooms they join), circles between modules and between rooms."""
    graph = imports(root)
    rooms = rooms_graph(graph)
    up = arrows_up(graph, floors)
    return {"modules": len(graph), "rooms": len(rooms),
            "packages": sum(1 for r in rooms if (root / r).is_dir()), "floors": len(floors),
            "arrows": sum(len(v) for v in rooms.values()), "arrows_up": up,
            "room_pairs_up": sorted({(layer(a.split()[0]), layer(a.split()[-1])) for a in up}),
            "module_cycles": cycles(graph), "room_cycles": cycles(rooms)}


if __name__ == "__main__":
    # python tests/test_import_graph.py [PACKAGE_DIR [room=floor ...]]: the numbers, for a tree of any age (rooms
    # this version's FLOORS does not know are placed by the arguments)
    import json
    import sys
    floors = {k: list(v) for k, v in FLOORS.items()}
    for arg in sys.argv[2:]:
        room, fl = arg.split("=")
        floors[fl].append(room)
    m = measure(Path(sys.argv[1]) if len(sys.argv) > 1 else PKG, {k: tuple(v) for k, v in floors.items()})
    print(json.dumps({**m, "arrows_up": len(m["arrows_up"]), "arrows_up_list": m["arrows_up"]}, indent=1,
                     default=list))
