"""The sandbox: programs written by a model run here, each in a cell of its own (docs/code-sandbox.md).

    from slime_actors.sandbox import LocalSandbox          # slime's async Sandbox protocol, on this machine
    async with LocalSandbox() as sb:
        await sb.write_file("main.py", "print(6 * 7)")
        code, out, err = await sb.exec("python3 main.py", timeout=10)

    from slime_actors.sandbox import Runner, Limits        # one program, one fresh cell (what the code reward uses)
    r = Runner(limits=Limits(timeout=5)).run(python_file="main.py", files={"main.py": src}, stdin=b"...")
"""

from .layers import Plan, Policy, SandboxUnavailable, make_plan, probe
from .local import LocalSandbox
from .protocol import ExecResult, FileContent, Sandbox
from .runner import Limits, RunResult, Runner, SandboxError

__all__ = ["ExecResult", "FileContent", "Limits", "LocalSandbox", "Plan", "Policy", "RunResult", "Runner", "Sandbox",
           "SandboxError", "SandboxUnavailable", "make_plan", "probe"]
