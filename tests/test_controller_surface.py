"""The RL loop uses only what the controller declares for it (slime_actors/actors/controller/surface.py: `Ctl`), and
the controller provides all of it: the loop cannot grow into a grab-bag of the actor's members again (an actor's
ask/tell, its runtime, ... belong in one of the controller's parts)."""

from __future__ import annotations

import ast
from pathlib import Path

from slime_actors.actors.controller import Controller
from slime_actors.config import parse_config

PKG = Path(__file__).resolve().parents[1] / "slime_actors" / "actors" / "controller"


def declared(surface: str) -> set[str]:
    """The members of `class Ctl` in surface.py's text: its annotated attributes and its methods."""
    cls = next(n for n in ast.walk(ast.parse(surface)) if isinstance(n, ast.ClassDef) and n.name == "Ctl")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)} | \
        {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def used(loop: str) -> dict[str, int]:
    """Every `ctl.NAME` the loop's text reads, calls or assigns: NAME -> the first line."""
    out: dict[str, int] = {}
    for n in ast.walk(ast.parse(loop)):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "ctl":
            out.setdefault(n.attr, n.lineno)
    return out


def undeclared(loop: str, surface: str) -> list[str]:
    allowed = declared(surface)
    return [f"loop.py:{line}: ctl.{name}" for name, line in sorted(used(loop).items()) if name not in allowed]


def test_the_loop_uses_only_the_declared_surface():
    assert undeclared((PKG / "loop.py").read_text(), (PKG / "surface.py").read_text()) == []


def test_a_member_outside_the_surface_is_found():
    loop = (PKG / "loop.py").read_text() + "\n\nasync def _added(ctl):\n    await ctl.ask('buffer/0', 'ping')\n"
    assert [x.split(": ", 1)[1] for x in undeclared(loop, (PKG / "surface.py").read_text())] == ["ctl.ask"]


def test_the_surface_is_small_and_the_controller_provides_it(tmp_path):
    names = declared((PKG / "surface.py").read_text())
    assert 10 <= len(names) <= 16, sorted(names)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    ctl = Controller(0, args=parse_config(["--hf-checkpoint", "tiny:digits", "--prompt-data", str(prompts),
                                           "--input-key", "input", "--label-key", "label", "--rm-type", "exact_match"]).to_dict())
    assert [n for n in sorted(names) if not hasattr(ctl, n)] == []
