"""Names that explain themselves (issue 29): in slime_actors/ no module is imported under a one-letter alias
(`from .. import env as E` was in 12 files; `from . import lora as L`), and the job config is not read through
one-letter or clipped aliases (`a = self.cfg`, `ro = cfg.rollout`, `eng`, `rw`, `lg`, `mon`, ...): a section's alias is
named after it (`rollout_cfg = cfg.rollout`). Read with ast; each rule is shown to catch its violation."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "slime_actors"

# the one community convention kept: torch.nn.functional as F (as torch's own docs write it)
ALLOWED_ALIASES = {("torch.nn.functional", "F")}
CONFIG_SOURCES = ("cfg", "self.cfg", "config", "self.config", "ctl.cfg", "self.ctl.cfg")


def one_letter_aliases(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                full = a.name if isinstance(node, ast.Import) else \
                    "." * node.level + (f"{node.module}." if node.module else "") + a.name
                if a.asname and len(a.asname) == 1 and (full.lstrip("."), a.asname) not in ALLOWED_ALIASES:
                    out.append(f"line {node.lineno}: {full} as {a.asname}")
    return out


def _is_config(expr: ast.AST) -> bool:
    text = ast.unparse(expr)
    return text in CONFIG_SOURCES or (isinstance(expr, ast.Attribute) and ast.unparse(expr.value) in CONFIG_SOURCES
                                      and not text.endswith(")"))


def clipped_config_aliases(tree: ast.AST) -> list[str]:
    """`x = cfg`, `x = self.cfg.section`, `x, y = cfg.a, cfg.b` with a name of at most 3 letters (but `cfg`, `run`)."""
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        t, v = node.targets[0], node.value
        pairs = [(t, v)] if isinstance(t, ast.Name) else (
            list(zip(t.elts, v.elts)) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else [])
        for target, value in pairs:
            if isinstance(target, ast.Name) and len(target.id) <= 3 and target.id not in ("cfg", "run") \
                    and _is_config(value):
                out.append(f"line {node.lineno}: {target.id} = {ast.unparse(value)}")
    return out


def scan(rule) -> list[str]:
    return [f"{p.relative_to(PKG.parent)}: {v}" for p in sorted(PKG.rglob("*.py"))
            for v in rule(ast.parse(p.read_text(), str(p)))]


def test_no_module_has_a_one_letter_alias():
    assert scan(one_letter_aliases) == [], "import it by its name, or its names (from ..env import RUN_DIR)"


def test_no_config_section_has_a_clipped_alias():
    assert scan(clipped_config_aliases) == [], "name the alias after its section: rollout_cfg = cfg.rollout"


def test_the_rules_catch_what_they_forbid():
    assert one_letter_aliases(ast.parse("from .. import env as E\nimport numpy as n\n")) == [
        "line 1: ..env as E", "line 2: numpy as n"]
    assert one_letter_aliases(ast.parse("import torch.nn.functional as F\nfrom .. import env\nimport numpy as np\n")) == []
    found = clipped_config_aliases(ast.parse(
        "a = self.cfg\nro = cfg.rollout\nrun, tr = cfg.run, cfg.train\nd = cfg.to_dict()\nrollout_cfg = cfg.rollout\n"))
    assert found == ["line 1: a = self.cfg", "line 2: ro = cfg.rollout", "line 3: tr = cfg.train"]
