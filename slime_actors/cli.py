"""The `slime-actors` command.

    slime-actors train [--config FILE.toml] [slime-style flags...]   the RL loop (see `slime-actors train --help`)
    slime-actors demo [--run-dir DIR]                                  actors exchanging traced messages
    slime-actors trace summary RUN_DIR                                 counts and latency percentiles per method
"""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(args.run_dir, args.messages)


def _cmd_trace(args) -> int:
    from .traces.reader import TraceFormatError, TraceRun
    try:
        run = TraceRun(args.run)
    except TraceFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.trace_cmd == "summary":
        from .traces.summary import render
        print(render(run))
        return 0
    raise SystemExit(f"unknown trace command {args.trace_cmd}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slime-actors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="a small demo of actors exchanging traced messages")
    d.add_argument("--run-dir", default="runs/demo")
    d.add_argument("--messages", type=int, default=200)
    d.set_defaults(fn=_cmd_demo)

    t = sub.add_parser("trace", help="read a run's traces")
    tsub = t.add_subparsers(dest="trace_cmd", required=True)
    s = tsub.add_parser("summary", help="per role and method: counts, bytes, latency percentiles, errors")
    s.add_argument("run", help="run directory (or its traces/ folder)")
    t.set_defaults(fn=_cmd_trace)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "train":
        from .train import main as train_main
        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
