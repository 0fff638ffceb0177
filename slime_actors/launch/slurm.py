"""`slime-actors sbatch TOPOLOGY [--config job.toml] [flags] > job.sbatch`: a Slurm batch script for a topology.

The script asks for the topology's node groups -- as a heterogeneous job, one component per node group (trainer
nodes and rollout nodes, each with their GPUs), or as one homogeneous allocation split in order -- and runs:

  * the head step on the first node of the head's node group (`scontrol show hostnames` gives it): the directory
    and the controller, bound to a port every node knows (the rendezvous);
  * one `srun` step per role, one task per node of the role's node group, each task a node agent that starts that
    node's actors of the role and restarts them per the topology's policy (`slime-actors launch --join`).

The job's CURVE keys -- and the engines' HTTP keys, unless the engines are external -- are made once in the batch
script and reach every step through the environment (keys the user exported before sbatch are kept). The head ends
the job: when training is done it stops every step, and the script exits with the head's exit code.

    python -m slime_actors.launch.slurm keys [--engine]   # prints `export SLIME_ACTORS_CURVE_PUBLIC=... SECRET=...`
                                                          # (--engine: and SLIME_ACTORS_ENGINE_API_KEY / ADMIN_KEY)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from .. import env as E
from ..config import has_flag
from .topology import Topology


def _q(s: str) -> str:
    return shlex.quote(str(s))


def _var(group: str) -> str:
    return "nodes_" + "".join(c if c.isalnum() else "_" for c in group)


def layout(topo: Topology, requested: str | None) -> str:
    want = requested or topo.slurm.get("layout", "auto")
    if want == "auto":
        return "heterogeneous" if len(topo.nodes) > 1 else "homogeneous"
    return want


def render(topo: Topology, job_argv: list[str], *, python: str | None = None, workdir: str | None = None,
           run_dir: str | None = None, layout_name: str | None = None, port: int | None = None,
           command_line: str = "", engine_keys: bool = True, retriever_key: bool = False) -> str:
    s = topo.slurm
    lay = layout(topo, layout_name)
    groups = list(topo.nodes.values())
    if python is None:
        python = str(Path(s["venv"]) / "bin" / "python") if s.get("venv") else sys.executable
    workdir = workdir or s.get("workdir") or os.getcwd()
    port = port or s.get("port")
    run_dir = run_dir or s.get("run_dir")
    if run_dir and not has_flag(job_argv, "--run-dir"):
        job_argv = [*job_argv, "--run-dir", str(run_dir)]  # on a filesystem every node sees
    job_name = s.get("job_name", "slime-actors")
    out: list[str] = ["#!/bin/bash"]
    out.append(f"# Written by `slime-actors sbatch{(' ' + command_line) if command_line else ''}`; see docs/launch.md.")
    if lay == "heterogeneous":
        out.append("# Layout: heterogeneous, one component per node group: "
                   + "; ".join(f"{i}: {g.name} ({g.count} node{'s' if g.count > 1 else ''}"
                               f"{f', {g.gpus} GPU/node' if g.gpus else ''})" for i, g in enumerate(groups)))
    else:
        out.append("# Layout: one allocation of " + str(sum(g.count for g in groups)) + " node(s), split in order: "
                   + ", ".join(f"{g.name} x{g.count}" for g in groups))
    out.append(f"#SBATCH --job-name={job_name}")
    out.append(f"#SBATCH --output={s.get('output', 'slurm-%x-%j.out')}")
    for key in ("time", "partition", "account"):
        if s.get(key):
            out.append(f"#SBATCH --{key}={s[key]}")
    for line in s.get("sbatch", []):
        out.append(f"#SBATCH {line}")

    def component(nodes: int, gpus: int, cpus: int | None, extra: dict) -> str:
        parts = [f"--nodes={nodes}", "--ntasks-per-node=1"]
        if gpus:
            parts.append(f"--gpus-per-node={gpus}")
        if cpus:
            parts.append(f"--cpus-per-task={cpus}")
        for k, v in extra.items():
            parts.append(f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}"))
        return "#SBATCH " + " ".join(parts)

    if lay == "heterogeneous":
        for i, g in enumerate(groups):
            if i:
                out.append("#SBATCH hetjob")
            out.append(component(g.count, g.gpus, g.cpus, g.slurm))
    else:
        extra: dict = {}
        for g in groups:
            extra.update(g.slurm)
        out.append(component(sum(g.count for g in groups), max(g.gpus for g in groups),
                             max((g.cpus or 0) for g in groups) or None, extra))
    out.append("")
    out.append("set -euo pipefail")
    out.append(f"cd {_q(workdir)}")
    for line in s.get("setup", []):
        out.append(line)
    out.append(f"PY={_q(python)}")
    out.append(f"TOPOLOGY={_q(Path(topo.path).resolve())}")
    out.append("JOB_ARGS=(" + " ".join(_q(a) for a in job_argv) + ")")
    out.append("")
    out.append("# the nodes of each node group")
    if lay == "heterogeneous":
        for i, g in enumerate(groups):
            out.append(f"{_var(g.name)}=($(scontrol show hostnames \"${{SLURM_JOB_NODELIST_HET_GROUP_{i}}}\"))")
    else:
        out.append("all_nodes=($(scontrol show hostnames \"$SLURM_JOB_NODELIST\"))")
        off = 0
        for g in groups:
            out.append(f"{_var(g.name)}=(\"${{all_nodes[@]:{off}:{g.count}}}\")")
            off += g.count
    out.append(f"head=${{{_var(topo.head)}[0]}}   # first node of node group {topo.head!r}: the rendezvous")
    if port:
        out.append(f"port=${{{E.HEAD_PORT.name}:-{int(port)}}}")
    else:
        out.append(f"port=${{{E.HEAD_PORT.name}:-$(( 20000 + SLURM_JOB_ID % 20000 ))}}")
    out.append(f"export {E.TRANSPORT.name}=tcp {E.HOST.name}=0.0.0.0")
    if engine_keys:
        out.append("# the job's CURVE keys and engine HTTP keys, made once here, reach every step through the "
                   "environment")
        out.append("eval \"$(\"$PY\" -m slime_actors.launch.slurm keys --engine"
                   + (" --retriever" if retriever_key else "") + ")\"")
    else:
        out.append("# the job's CURVE keys, made once here, reach every step through the environment")
        out.append("eval \"$(\"$PY\" -m slime_actors.launch.slurm keys" + (" --retriever" if retriever_key else "")
                   + ")\"")
    out.append("")
    srun_extra = " ".join(s.get("srun", []))
    het = lay == "heterogeneous"
    gi = {g.name: i for i, g in enumerate(groups)}

    def srun(group: str, nodes_expr: str, n: int, name: str, gpus: int) -> str:
        opts = ["srun"]
        if het:
            opts.append(f"--het-group={gi[group]}")
        opts += [f"--nodes={n}", "--ntasks-per-node=1", f"--nodelist={nodes_expr}", "--overlap",
                 f"--job-name={name}", "--kill-on-bad-exit=0"]
        if gpus:
            opts.append(f"--gpus-per-node={gpus}")
        if srun_extra:
            opts.append(srun_extra)
        return " ".join(opts)

    out.append("# the head: directory and controller (no actors); the job ends when it ends")
    out.append(srun(topo.head, "\"$head\"", 1, "head", 0)
               + f" \\\n    \"$PY\" -m slime_actors.cli launch \"$TOPOLOGY\" --node {topo.head}:0 --head-port \"$port\" "
                 "--roles none --status changes \"${JOB_ARGS[@]}\" &")
    out.append("head_step=$!")
    out.append("")
    out.append("# one step per role: a task per node of the role's node group, each supervising that node's actors")
    for r in topo.roles.values():
        if not r.count:
            continue
        g = topo.nodes[r.nodes]
        used = min(g.count, r.count)
        nodes_expr = f"$(IFS=,; echo \"${{{_var(g.name)}[*]:0:{used}}}\")"
        out.append(srun(r.nodes, f"\"{nodes_expr}\"", used, r.name, g.gpus)
                   + " \\\n    bash -c 'export SLIME_ACTORS_ADVERTISE=${SLIME_ACTORS_ADVERTISE:-$(hostname)}; "
                     f"exec \"$0\" -m slime_actors.cli launch \"$1\" --node {r.nodes}:$SLURM_PROCID "
                     f"--join \"tcp://$2\" --roles {r.name} --status off \"${{@:3}}\"' "
                     "\"$PY\" \"$TOPOLOGY\" \"$head:$port\" \"${JOB_ARGS[@]}\" &")
    out.append("")
    out.append("rc=0")
    out.append("wait \"$head_step\" || rc=$?")
    out.append("wait || true   # the head stopped every role step on its way out")
    out.append("exit \"$rc\"")
    return "\n".join(out) + "\n"


def sbatch_main(argv: list[str]) -> int:
    from ..config import ConfigError
    from .job_config import plan_job, print_errors
    from .topology import TopologyError, load_topology
    p = argparse.ArgumentParser(
        prog="slime-actors sbatch", allow_abbrev=False,   # a job flag must not be taken for --port, --python ...
        description="Write a Slurm batch script for a topology to stdout (docs/launch.md). Every option not listed "
                    "here is a job flag, checked now and passed to every step.")
    p.add_argument("topology")
    p.add_argument("--layout", choices=["auto", "heterogeneous", "homogeneous"], default=None,
                   help="auto: heterogeneous when the topology has several node groups")
    p.add_argument("--python", default=None, help="the Python with slime-actors on the nodes (default: this one)")
    p.add_argument("--workdir", default=None, help="directory the job runs in (default: here)")
    p.add_argument("--port", type=int, default=None, help="the head's directory port (default: from the job id)")
    p.add_argument("--output", default=None, help="#SBATCH --output (default: slurm-%%x-%%j.out in the workdir)")
    p.add_argument("--run-dir", dest="sbatch_run_dir", default=None,
                   help="the job's run directory, on a filesystem every node sees (default: [slurm] run_dir, else "
                        "the job flags' --run-dir)")
    ns, rest = p.parse_known_args(argv)
    try:
        topo = load_topology(ns.topology)
        if ns.output:
            topo.slurm["output"] = ns.output
        job_argv = list(rest)
        if topo.job_config and not has_flag(job_argv, "--config"):
            job_argv = ["--config", str(Path(topo.job_config).resolve())] + job_argv
        for flag in ("--engine-api-key", "--engine-admin-api-key"):
            if has_flag(job_argv, flag):
                raise ConfigError(f"{flag} would be written into the batch script: give {flag}-file (on a "
                                  "filesystem the nodes see) or export its SLIME_ACTORS_ENGINE_* variable before "
                                  "sbatch (docs/security.md)")
        if has_flag(job_argv, "--wandb-key"):
            raise ConfigError("--wandb-key would be written into the batch script: export WANDB_API_KEY before "
                              "sbatch (or `wandb login` on the nodes)")
        cfg = plan_job(job_argv, topo, data=True).cfg   # the prompt files too: a bad row fails here, not queued
    except ConfigError as exc:
        print_errors(exc, "slime-actors sbatch")
        return 2
    except (TopologyError, ValueError) as exc:
        print(f"slime-actors sbatch: error: {exc}", file=sys.stderr)
        return 2
    lay = layout(topo, ns.layout)
    if lay == "homogeneous" and len({(g.gpus, g.cpus) for g in topo.nodes.values()}) > 1:
        print("slime-actors sbatch: note: node groups differ in GPUs/CPUs; a homogeneous allocation gives every node "
              "the most any group asks for", file=sys.stderr)
    # paths in the flags must hold on the nodes: make relative ones absolute
    job_argv = [_abs_if_path(a) for a in job_argv]
    run_dir = _abs_if_path(ns.sbatch_run_dir) if ns.sbatch_run_dir else None
    if run_dir:  # the option wins over a --run-dir among the job flags
        job_argv = [a for i, a in enumerate(job_argv) if not (a.startswith("--run-dir=") or a == "--run-dir" or (
            i > 0 and job_argv[i - 1] == "--run-dir"))]
    eng = cfg.engine
    sys.stdout.write(render(topo, job_argv, python=ns.python, workdir=ns.workdir, run_dir=run_dir, layout_name=lay,
                            port=ns.port, command_line=" ".join(shlex.quote(a) for a in argv),
                            engine_keys=bool(eng.engine_auth and not eng.rollout_external_engine_addrs),
                            retriever_key=bool(cfg.retriever.retriever_corpus)))
    return 0


def _abs_if_path(a: str) -> str:
    if a.startswith("-") or "/" not in a and not a.endswith((".toml", ".jsonl", ".json", ".parquet")):
        return a
    p = Path(a)
    return str(p.resolve()) if (p.exists() or p.parent.exists()) and not p.is_absolute() else a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keys"] and set(argv[1:]) <= {"--engine", "--retriever"}:
        from ..backends.engine_auth import EngineKeys
        from ..mailbox.security import JobKeys
        made = {}
        if not (E.CURVE_PUBLIC.get() and E.CURVE_SECRET.get()):
            made.update(JobKeys.create().env())  # (keys given by the user are kept)
        if "--engine" in argv:
            given = EngineKeys.from_env() or EngineKeys()
            made.update({k: v for k, v in given.fill(EngineKeys.create()).env().items() if k not in os.environ})
        if "--retriever" in argv and not E.RETRIEVER_KEY.get():
            import secrets
            made[E.RETRIEVER_KEY.name] = secrets.token_hex(32)   # the job's retriever key (search/keys.py)
        for k, v in made.items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    print("usage: python -m slime_actors.launch.slurm keys [--engine] [--retriever]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
