"""Docs, examples and scripts speak to a user on their own machine: no absolute path of one particular machine
(`/work/...`, `/root/...`) and none of the words of the tooling the maintainers borrow GPUs through (machine-kind
names such as `nvidia-h200-x2`, `KINDS.md`, "device call"). A user's GPU machine is described by its hardware
("one H200", "two H200s on one host") and paths are relative to the repository or variables the user sets.

Also: README.md starts with exactly the two commands a fresh machine runs, `make train` and `make test`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# what a user-facing file must not name: (pattern, why)
FORBIDDEN = [
    (re.compile(r"/work/"), "an absolute path of one machine: write it relative to the repository or as a variable"),
    (re.compile(r"/root/"), "an absolute path of one machine: write it relative to the repository or as a variable"),
    (re.compile(r"nvidia-h200", re.I), "a machine-kind name of the maintainers' GPU tooling: describe the hardware "
                                       "(one H200; two H200s on one host)"),
    (re.compile(r"KINDS\.md"), "a file of the maintainers' GPU tooling, not of this repository"),
    (re.compile(r"\.library/"), "a folder of the maintainers' tooling, not of this repository"),
    (re.compile(r"device (call|tool)", re.I), "the maintainers' GPU tooling: say what a user runs, on what hardware"),
]

SCANNED = ["README.md", "docs", "examples", "scripts"]


def user_facing_files(root: Path) -> list[Path]:
    files = []
    for name in SCANNED:
        p = root / name
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(f for f in sorted(p.rglob("*"))
                         if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".png", ".pyc"))
    return files


def findings(root: Path) -> list[str]:
    """Every forbidden name in the user-facing files under root, as 'path:line: name (why)'."""
    out = []
    for f in user_facing_files(root):
        data = f.read_bytes()
        if b"\0" in data:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            for pat, why in FORBIDDEN:
                m = pat.search(line)
                if m:
                    out.append(f"{f.relative_to(root)}:{n}: {m.group(0)!r} -- {why}: {line.strip()[:160]}")
    return out


def readme_commands(readme: Path) -> list[str]:
    """The README's opening commands: its first non-empty lines up to the first line that is not a command,
    each without its trailing comment."""
    cmds = []
    for line in readme.read_text().splitlines():
        if not line.strip():
            if cmds:
                break
            continue
        if not line.startswith("    "):  # an indented code line is a command; the first prose line ends them
            break
        cmds.append(line.split("#", 1)[0].strip())
    return cmds


def test_user_facing_files_name_no_machine_paths_or_tool_words():
    found = findings(ROOT)
    assert not found, "user-facing files name one machine or the GPU tooling:\n" + "\n".join(found)


def test_the_scan_finds_each_forbidden_name(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "examples" / "x").mkdir(parents=True)
    (tmp_path / "README.md").write_text("    make train\n    make test\n\ncd /work/main\n")
    (tmp_path / "docs" / "a.md").write_text("fine\non a 2-GPU machine (nvidia-h200-x2)\nsee KINDS.md\n")
    (tmp_path / "scripts" / "b.sh").write_text("# one device call per part\nSITE=/root/site\n")
    (tmp_path / "examples" / "x" / "c.py").write_text("p = '/work/.library/x'\n")
    (tmp_path / "docs" / "img.png").write_bytes(b"\x89PNG\0/work/")
    got = findings(tmp_path)
    assert [g.split(": ", 1)[0] for g in got] == [
        "README.md:4", "docs/a.md:2", "docs/a.md:3", "examples/x/c.py:1", "examples/x/c.py:1", "scripts/b.sh:1",
        "scripts/b.sh:2"], got
    assert "'nvidia-h200'" in got[1] and "'/root/'" in got[-1]


def test_readme_starts_with_make_train_then_make_test():
    assert readme_commands(ROOT / "README.md")[:2] == ["make train", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("train", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no '{target}' target"


@pytest.mark.parametrize("text, first_two", [
    ("    make train    # the loop\n    make test     # the suite\n\n# slime-actors\n", ["make train", "make test"]),
    ("# slime-actors\n\n    make train\n", []),
    ("\n    make test\n    make train\n", ["make test", "make train"]),
    ("    make install && make train\n    make test\n", ["make install && make train", "make test"]),
])
def test_readme_commands_reads_the_opening_lines(tmp_path, text, first_two):
    (tmp_path / "README.md").write_text(text)
    assert readme_commands(tmp_path / "README.md")[:2] == first_two


def readme_convert_line(readme: Path) -> str:
    """The README's `slime-actors convert` line of a checkpoint of `make train` (its comment cut off)."""
    for line in readme.read_text().splitlines():
        cmd = line.split("#", 1)[0].strip()
        if cmd.startswith("slime-actors convert "):
            return cmd
    raise AssertionError(f"{readme} names no `slime-actors convert` command")


@pytest.mark.slow
def test_readme_convert_line_works_after_make_train(tmp_path):
    """The README's commands in its order: `make train` (the digits job, shortened here), then its `slime-actors
    convert runs/digits/ckpt out/hf` -- run as written, from the directory the job ran in -- gives a Hugging Face
    directory transformers loads. It failed when a job without --save kept no checkpoint (issue 27)."""
    import subprocess
    import sys
    import tomllib
    line = readme_convert_line(ROOT / "README.md")
    config = ROOT / "examples" / "digits" / "config.toml"
    run_dir = tomllib.loads(config.read_text())["run_dir"]
    assert line.split()[2].startswith(run_dir + "/"), (line, run_dir)  # the README names the job's own directory
    bin_dir = Path(sys.executable).parent
    p = subprocess.run([str(bin_dir / "slime-actors"), "train", "--config", str(config), "--num-rollout", "3",
                        "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--global-batch-size", "32",
                        "--micro-batch-size", "32", "--eval-interval", "0", "--skip-eval-before-train",
                        "--progress", "false"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    argv = line.split()
    p = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    from transformers import AutoModelForCausalLM
    out = tmp_path / argv[-1]
    assert AutoModelForCausalLM.from_pretrained(out) is not None
