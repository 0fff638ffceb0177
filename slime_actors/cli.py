"""The `slime-actors` command.

    slime-actors train [--config FILE.toml] [slime-style flags...]   the RL loop (see `slime-actors train --help`)
    slime-actors launch TOPOLOGY [--config FILE.toml] [flags...]       the RL loop placed and supervised by a topology
    slime-actors sbatch TOPOLOGY [--config FILE.toml] [flags...]       a Slurm batch script for it (docs/launch.md)
    slime-actors demo [--run-dir DIR]                                  actors exchanging traced messages
    slime-actors trace summary|show|chain|diff|export|timeline RUN     read a run's traces (docs/debugging.md)
    slime-actors replay RUN --actor ROLE/INDEX                         one actor again against its recording
    slime-actors samples RUN [--rollout K] [--best|--worst] [--n N]    a run's prompts, responses, rewards
                     [--eval [--step K]] [--report]                    (held-out ones; a markdown report)
    slime-actors convert SRC DST [--hf-checkpoint DIR]                 checkpoints <-> Hugging Face (torch_dist, ours)
    slime-actors stacks RUN [--actor ROLE/INDEX] [--all-threads]       what a running job's actors are doing now
                     [--native]                                        (faulthandler's dump: also from C calls)
    slime-actors --version
"""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(args.run_dir, args.messages)


# commands with parsers of their own (main() hands them their arguments): listed here for --help
DELEGATED = {
    "train": "the RL loop on this host (`slime-actors train --help`: every flag, slime's names)",
    "launch": "the RL loop placed and supervised by a topology file (docs/launch.md)",
    "sbatch": "a Slurm batch script for a topology (docs/launch.md)",
    "convert": "checkpoints <-> Hugging Face directories (torch_dist, this project's)",
}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    p = argparse.ArgumentParser(prog="slime-actors", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"slime-actors {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, text in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)

    d = sub.add_parser("demo", help="a small demo of actors exchanging traced messages")
    d.add_argument("--run-dir", default="runs/demo")
    d.add_argument("--messages", type=int, default=200)
    d.set_defaults(fn=_cmd_demo)

    from .traces.cli import add_replay_command, add_trace_commands
    add_trace_commands(sub)   # trace summary|show|chain|diff|export|timeline (slime_actors/traces/cli.py)
    add_replay_command(sub)
    from .samples import add_samples_command
    add_samples_command(sub)   # samples RUN ... (slime_actors/samples.py)
    from .launch.stacks import add_stacks_command
    add_stacks_command(sub)    # stacks RUN (slime_actors/launch/stacks.py)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "train":
        from .train import main as train_main
        return train_main(argv[1:])
    if argv and argv[0] == "launch":  # job flags pass through, as for train
        from .launch.job import launch_main
        return launch_main(argv[1:])
    if argv and argv[0] == "convert":
        from .convert import main as convert_main
        return convert_main(argv[1:])
    if argv and argv[0] == "sbatch":
        from .launch.slurm import sbatch_main
        return sbatch_main(argv[1:])
    parser = build_parser()
    if not argv:   # what the command can do, instead of "the following arguments are required"
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
