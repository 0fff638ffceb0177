"""Record slime's own flags (what slime's `train.py` accepts besides Megatron's and SGLang's) from its source.

    python tests/data/slime_record_arguments.py COMMIT SLIME_CHECKOUT/slime/utils/arguments.py \
        SLIME_CHECKOUT/slime/backends/sglang_utils/arguments.py > tests/data/slime_arguments.json

slime builds its parser in `slime/utils/arguments.py`: `get_slime_extra_args_provider` adds its flags with
`parser.add_argument(...)` and changes some of Megatron's defaults with `reset_arg(parser, "--name", ...)`;
`_pre_parse_mode` adds `--train-backend` and the debug modes; `slime/backends/sglang_utils/arguments.py` adds the
router's address (`--sglang-router-ip/-port`; SGLang's own flags come as `--sglang-*` from SGLang's parser, which
this table leaves out). This script reads those calls from the AST (no import:
slime needs Ray, Megatron and SGLang) and writes, per flag: its default as a literal (or null when it is an
expression), whether it takes a value (`switch`: store_true / store_false), nargs, choices, and `dest`.

The table is data for our tests and docs/flags.md: which of our flags are slime's (same name), and where our
default differs from slime's (the reason is written next to our flag, slime_actors/config.py).
"""

from __future__ import annotations

import ast
import json
import sys


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.BinOp):  # 512 * 1024**2
            try:
                return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})
            except Exception:
                return None
        return None


def record(source: str) -> dict:
    tree = ast.parse(source)
    flags: dict[str, dict] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if name == "add_argument":
            args = node.args
        elif name == "reset_arg":
            args = node.args[1:]
        else:
            continue
        opts = [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                and a.value.startswith("--")]
        if not opts:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = _literal(kw["action"]) if "action" in kw and isinstance(kw["action"], ast.Constant) else (
            ast.unparse(kw["action"]) if "action" in kw else None)
        switch = action in ("store_true", "store_false")
        default = _literal(kw["default"]) if "default" in kw else (
            (action == "store_false") if switch else None)
        entry = {
            "default": default,
            "switch": switch,
            "action": action,
            "nargs": _literal(kw["nargs"]) if "nargs" in kw else None,
            "choices": _literal(kw["choices"]) if "choices" in kw else None,
            "type": ast.unparse(kw["type"]) if "type" in kw else None,
            "dest": _literal(kw["dest"]) if "dest" in kw else opts[0][2:].replace("-", "_"),
            "reset": name == "reset_arg",
        }
        for opt in opts:
            flags.setdefault(opt, entry)
    return dict(sorted(flags.items()))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    commit, paths = argv[0], argv[1:]
    flags: dict[str, dict] = {}
    for path in paths:
        with open(path) as f:
            for name, entry in record(f.read()).items():
                flags.setdefault(name, entry)
    json.dump({"slime_commit": commit, "sources": ["slime/utils/arguments.py",
                                                   "slime/backends/sglang_utils/arguments.py"],
               "what": "slime's flags (add_argument / reset_arg calls): default, switch, nargs, choices, dest",
               "flags": dict(sorted(flags.items()))}, sys.stdout, indent=1, sort_keys=False)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
