"""megatron-core has no CPU path: the backend refuses --device cpu with a message that says what to do, and the shim
that runs it on CPU for tests lives in tests/ (megatron_cpu_shim.py), not in the package -- production code patches
nothing of torch. Runs without megatron-core (the refusal comes before megatron is imported)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _torch_patches(path: Path) -> list[str]:
    """Assignments to attributes of torch (`torch.x = ...`, `torch.cuda.x = ...`, `torch.Tensor.x = ...`, setattr
    on torch or one of its modules) in one file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            targets = node.args[:1]
        for t in targets:
            root = t.value if isinstance(t, ast.Attribute) else t if isinstance(node, ast.Call) else None
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id == "torch":
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_the_package_patches_nothing_of_torch():
    found = [p for f in sorted((ROOT / "slime_actors").rglob("*.py")) for p in _torch_patches(f)]
    assert found == [], f"production code patches torch: {found}"
    assert _torch_patches(ROOT / "tests" / "megatron_cpu_shim.py")  # the check sees the shim's patches


def test_megatron_on_cpu_is_refused_without_the_test_shim(tmp_path):
    """In a process of its own: were the shim still applied by the backend, it would patch this one's torch."""
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from test_torch_backend import make_args
from slime_actors.backends.megatron_backend import MegatronBackend
args = make_args({str(tmp_path)!r}, {str(tmp_path / "no-model")!r}, train_backend="megatron", device="cpu")
try:
    MegatronBackend(args, 0, 1).init()
except RuntimeError as e:
    print("REFUSED:", e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "REFUSED: --train-backend megatron needs a GPU (--device cuda): megatron-core has no CPU path" in p.stdout, \
        p.stdout + p.stderr
    assert "tests/megatron_cpu_shim.py" in p.stdout
