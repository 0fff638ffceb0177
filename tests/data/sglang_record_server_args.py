"""Record SGLang's launch flags (what `python -m sglang.launch_server` accepts) from its source, without importing it.

    python tests/data/sglang_record_server_args.py /tmp/sgl/sglang/srt/server_args.py \
        > tests/data/sglang_server_args_0.5.15.post1.json
    python tests/data/sglang_record_server_args.py --router /tmp/sglr/sglang_router/router_args.py \
        > tests/data/sglang_router_args_0.3.2.json
    python tests/data/sglang_record_server_args.py --python tests/data/sglang_server_args_0.5.15.post1.json \
        tests/data/sglang_router_args_0.3.2.json > slime_actors/backends/sglang_flags.py

SGLang 0.5.15.post1 builds its parser in `ServerArgs.add_cli_args` (python/sglang/srt/server_args.py): every
dataclass field annotated `A[T, "help"]` or `A[T, Arg(...)]` becomes a flag through `add_cli_args_from_dataclass`
(python/sglang/srt/arg_groups/arg_utils.py: `--field-name` or `Arg.cli_name`, plus `Arg.aliases`; `bool` ->
store_true; `List[...]` -> nargs "+"; `Arg.nargs`/`Arg.action` as given; `no_cli=True` skipped), then a few flags are
added by hand (dynamic choices, `--config`, deprecated aliases). This script reads both from the AST and writes, per
flag: the dataclass field it sets (`dest`), whether it takes a value and how many (`nargs`), and where it is defined.
The wheel cannot be imported here (it needs CUDA-only packages); the AST is the same definition argparse sees.
"""

from __future__ import annotations

import ast
import json
import sys

# argparse actions that take no value (nargs=0): SGLang's own deprecated flag actions included
# (arg_groups/argparse_actions.py: DeprecatedAction, DeprecatedStoreTrueAction, DeprecatedStoreConstAction all
# default nargs=0; DeprecatedAliasStoreAction and LoRAPathAction take values).
NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version", "DeprecatedAction",
                    "DeprecatedStoreTrueAction", "DeprecatedStoreConstAction"}


def _src(node) -> str:
    return ast.unparse(node) if node is not None else ""


def _const(node):
    try:
        return ast.literal_eval(node)
    except Exception:
        return None


def _action_name(node) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return _src(node)


def _unwrap(tp):
    """Optional[X] / Union[X, None] / X | None -> (X, is_optional)."""
    if isinstance(tp, ast.Subscript) and _src(tp.value) in ("Optional", "typing.Optional"):
        return tp.slice, True
    if isinstance(tp, ast.Subscript) and _src(tp.value) in ("Union", "typing.Union"):
        elts = tp.slice.elts if isinstance(tp.slice, ast.Tuple) else [tp.slice]
        rest = [e for e in elts if _src(e) != "None"]
        if len(rest) == 1:
            return rest[0], True
        return tp, True
    return tp, False


def _is_list(tp) -> bool:
    return isinstance(tp, ast.Subscript) and _src(tp.value) in ("List", "list", "typing.List")


def record(path: str) -> dict:
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    flags: dict[str, dict] = {}

    def put(names, rec):
        for n in names:
            flags[n] = dict(rec, primary=names[0])

    # 1. dataclass fields with A[...] annotations (add_cli_args_from_dataclass)
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        ann = node.annotation
        if not (isinstance(ann, ast.Subscript) and _src(ann.value) in ("A", "Annotated")):
            continue
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        typ, meta = elts[0], elts[1] if len(elts) > 1 else None
        kw = {}
        if isinstance(meta, ast.Call) and _src(meta.func) == "Arg":
            kw = {k.arg: k.value for k in meta.keywords}
        elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
            continue
        if _const(kw.get("no_cli")) is True:
            continue
        field = node.target.id
        cli = _const(kw.get("cli_name")) or "--" + field.replace("_", "-")
        names = [cli] + list(_const(kw.get("aliases")) or [])
        inner, optional = _unwrap(typ)
        action = _action_name(kw.get("action"))
        nargs = _const(kw.get("nargs"))
        if action is not None:
            akw = {}
            if isinstance(kw.get("action_kwargs"), ast.Dict):
                akw = {(_const(k)): v for k, v in zip(kw["action_kwargs"].keys, kw["action_kwargs"].values)}
            nargs = _const(akw.get("nargs")) if "nargs" in akw else nargs
            if action == "BooleanOptionalAction":
                put(names, {"dest": field, "action": action, "takes_value": False, "nargs": 0,
                            "line": node.lineno})
                put(["--no-" + n[2:] for n in names], {"dest": field, "action": action, "takes_value": False,
                                                       "nargs": 0, "line": node.lineno})
                continue
            takes = action not in NO_VALUE_ACTIONS
            put(names, {"dest": field, "action": action, "takes_value": takes, "nargs": nargs if takes else 0,
                        "line": node.lineno})
            continue
        if _src(inner) == "bool":
            put(names, {"dest": field, "action": "store_true", "takes_value": False, "nargs": 0,
                        "line": node.lineno})
            continue
        if _is_list(inner) and kw.get("type_parser") is None:
            put(names, {"dest": field, "action": "store", "takes_value": True, "nargs": nargs or "+",
                        "line": node.lineno})
            continue
        required = _const(kw.get("required"))
        if required is None:
            required = node.value is None
        put(names, {"dest": field, "action": "store", "takes_value": True, "nargs": nargs,
                    "required": bool(required), "line": node.lineno})

    # 2. parser.add_argument(...) calls written out in add_cli_args
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument"):
            continue
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not names:
            continue
        kw = {k.arg: k.value for k in call.keywords}
        action = _action_name(kw.get("action")) or "store"
        dest = _const(kw.get("dest")) or names[0].lstrip("-").replace("-", "_")
        takes = action not in NO_VALUE_ACTIONS
        nargs = _const(kw.get("nargs")) if takes else 0
        put(names, {"dest": dest, "action": action, "takes_value": takes, "nargs": nargs,
                    "deprecated": action.startswith("Deprecated") or None, "line": call.lineno})
    for rec in flags.values():
        for k in [k for k, v in rec.items() if v is None]:
            del rec[k]
    return flags


def record_router(path: str) -> dict:
    """sglang-router's RouterArgs.add_cli_args (sglang_router/router_args.py): flags are f-strings
    f"--{prefix}name", prefix "" for `python -m sglang_router.launch_router` ("router-" inside slime)."""
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RouterArgs")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    flags: dict[str, dict] = {}
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument"):
            continue
        names = []
        for a in call.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                names.append(a.value)
            elif isinstance(a, ast.JoinedStr):
                names.append("".join(v.value if isinstance(v, ast.Constant) else "" for v in a.values))
        if not names:
            continue
        kw = {k.arg: k.value for k in call.keywords}
        action = _action_name(kw.get("action")) or "store"
        takes = action not in NO_VALUE_ACTIONS
        nargs = _const(kw.get("nargs")) if takes else 0
        rec = {"dest": _const(kw.get("dest")) or names[0].lstrip("-").replace("-", "_"), "action": action,
               "takes_value": takes, "nargs": nargs, "line": call.lineno}
        for n in names:
            flags[n] = {k: v for k, v in dict(rec, primary=names[0]).items() if v is not None}
    return flags


def python_table(server_json: str, router_json: str) -> str:
    """slime_actors/backends/sglang_flags.py: the two recorded tables as {flag: nargs} (0 = no value)."""
    srv, rtr = json.load(open(server_json)), json.load(open(router_json))

    def table(flags: dict) -> str:
        rows = []
        for f, rec in sorted(flags.items()):
            n = 0 if not rec["takes_value"] else rec.get("nargs")
            rows.append(f"    {f!r}: {n!r},")
        return "\n".join(rows)
    return (f'"""SGLang {srv["sglang_version"]} and sglang-router {rtr["sglang_router_version"]} launch flags, as '
            'recorded from their source.\n\nGenerated by tests/data/sglang_record_server_args.py --python from '
            'tests/data/sglang_server_args_*.json and\ntests/data/sglang_router_args_*.json (do not edit; '
            'tests/test_sglang_launch.py checks they agree). Each flag\nmaps to its argparse nargs: 0 = takes no '
            'value, None = one value, "+" / "*" / "?" as argparse.\n"""\n\n'
            f'SGLANG_VERSION = {srv["sglang_version"]!r}\nROUTER_VERSION = {rtr["sglang_router_version"]!r}\n\n'
            f'SERVER_FLAGS: dict[str, object] = {{\n{table(srv["flags"])}\n}}\n\n'
            f'ROUTER_FLAGS: dict[str, object] = {{\n{table(rtr["flags"])}\n}}\n')


def main(argv: list[str]) -> None:
    if len(argv) > 3 and argv[1] == "--python":
        sys.stdout.write(python_table(argv[2], argv[3]))
        return
    if len(argv) > 2 and argv[1] == "--router":
        out = {"sglang_router_version": "0.3.2",
               "source": {"file": "sglang_router/router_args.py (RouterArgs.add_cli_args, use_router_prefix=False: "
                                  "the flags of `python -m sglang_router.launch_router`)",
                          "wheel": "sglang_router-0.3.2-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                          "recorded_by": "tests/data/sglang_record_server_args.py --router (AST)"},
               "flags": dict(sorted(record_router(argv[2]).items()))}
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    path = argv[1] if len(argv) > 1 else "/tmp/sgl/sglang/srt/server_args.py"
    flags = record(path)
    out = {
        "sglang_version": "0.5.15.post1",
        "source": {"file": "python/sglang/srt/server_args.py (ServerArgs.add_cli_args, add_cli_args_from_dataclass "
                           "in python/sglang/srt/arg_groups/arg_utils.py)",
                   "wheel": "sglang-0.5.15.post1-cp311-cp311-manylinux_2_34_x86_64.whl",
                   "recorded_by": "tests/data/sglang_record_server_args.py (AST; the wheel is not imported)"},
        "what": "every flag `python -m sglang.launch_server` accepts: dest (ServerArgs field), takes_value, nargs, "
                "the flag's primary name, the line it is defined on; deprecated aliases marked",
        "flags": dict(sorted(flags.items())),
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv)
