"""Record how SGLang's HTTP server checks its --api-key / --admin-api-key, from its source.

    python tests/data/sglang_record_auth.py /tmp/sgl/sglang/srt > tests/data/sglang_auth_0.5.15.post1.json

(/tmp/sgl: the sglang-0.5.15.post1 wheel, unzipped; `pip download --no-deps sglang==0.5.15.post1`.)

What it writes:
  * `endpoints`: every route of python/sglang/srt/entrypoints/http_server.py -- path, methods, the handler and its
    line, and its auth level: the `@auth_level(AuthLevel.X)` mark, "normal" without one (the default of
    `_get_auth_level_from_app_and_scope`, utils/auth.py). Read from the AST.
  * `decisions` (columns in `decision_columns`; refused_with null = allowed): what `decide_request_auth`
    (python/sglang/srt/utils/auth.py) answers for every combination of the keys the server holds, the endpoint's
    level, the request's method, path and Authorization header. auth.py is
    "intentionally lightweight ... so it can be used in unit tests" (its docstring): it imports only the standard
    library at module level, so this script executes that file (never the rest of SGLang) to tabulate the function.
  * `facts`: where the middleware is installed and when not, the refusal bodies, and what /server_info returns,
    each with the source line it comes from (found by text, and checked to be there).
"""

from __future__ import annotations

import ast
import itertools
import json
import sys
import types
from pathlib import Path

ROUTE_METHODS = {"get": ["GET"], "post": ["POST"], "put": ["PUT"], "delete": ["DELETE"], "head": ["HEAD"]}
API, ADMIN = "api-key-A", "admin-key-M"
HEADERS = {"none": None, "bearer_api_key": f"Bearer {API}", "bearer_admin_key": f"Bearer {ADMIN}",
           "bearer_wrong": "Bearer nope", "lowercase_scheme_api_key": f"bearer {API}", "no_scheme_api_key": API,
           "basic_api_key": f"Basic {API}", "bearer_api_key_trailing_space": f"Bearer {API} "}
KEYS = {"none": (None, None), "api_key_only": (API, None), "admin_key_only": (None, ADMIN), "both": (API, ADMIN)}
PATHS = {"endpoint": "/update_weights_from_disk", "health": "/health", "health_generate": "/health_generate",
         "metrics": "/metrics"}


def routes(http_server: Path) -> dict:
    tree = ast.parse(http_server.read_text())
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        paths, level = [], "normal"
        for d in node.decorator_list:
            if not isinstance(d, ast.Call) or not isinstance(d.func, (ast.Attribute, ast.Name)):
                continue
            name = d.func.attr if isinstance(d.func, ast.Attribute) else d.func.id
            owner = ast.unparse(d.func.value) if isinstance(d.func, ast.Attribute) else ""
            if name == "auth_level":
                level = ast.unparse(d.args[0]).split(".")[-1].lower()
            elif owner == "app" and (name in ROUTE_METHODS or name == "api_route") and d.args:
                if not isinstance(d.args[0], ast.Constant):
                    continue  # a path from the environment (the Ollama / Vertex routes)
                methods = ROUTE_METHODS.get(name)
                for kw in d.keywords:
                    if kw.arg == "methods":
                        methods = ast.literal_eval(kw.value)
                paths.append((d.args[0].value, methods or ["GET"]))
        for path, methods in paths:
            key = path if path not in out else f"{path} {'/'.join(methods)}"
            out[key] = {"path": path, "methods": methods, "auth_level": level, "handler": node.name,
                        "source": f"python/sglang/srt/entrypoints/http_server.py:{node.lineno}"}
    return out


def decisions(auth_py: Path) -> list[dict]:
    mod = types.ModuleType("sglang_auth_recorded")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up there
    exec(compile(auth_py.read_text(), str(auth_py), "exec"), mod.__dict__)
    rows = []
    for (kname, (api, admin)), level, method, (pname, path), (hname, header) in itertools.product(
            KEYS.items(), list(mod.AuthLevel), ("POST", "OPTIONS"), PATHS.items(), HEADERS.items()):
        d = mod.decide_request_auth(method=method, path=path, authorization_header=header, api_key=api,
                                    admin_api_key=admin, auth_level=level)
        rows.append([kname, level.value, method, pname, hname, None if d.allowed else int(d.error_status_code)])
    return rows


DECISION_COLUMNS = ["keys", "level", "method", "path", "header", "refused_with"]


def line_of(path: Path, needle: str, rel: str) -> str:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return f"{rel}:{i}"
    raise SystemExit(f"{rel}: {needle!r} not found -- the source changed; read it again before recording")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    srt = Path(argv[0])
    http_server, auth_py = srt / "entrypoints" / "http_server.py", srt / "utils" / "auth.py"
    hs, au = "python/sglang/srt/entrypoints/http_server.py", "python/sglang/srt/utils/auth.py"
    engine_py, sa = srt / "entrypoints" / "engine.py", srt / "server_args.py"
    cfg = srt / "server_args_config_parser.py"
    record = {
        "sglang_version": "0.5.15.post1",
        "source": {"wheel": "sglang-0.5.15.post1-cp311-cp311-manylinux_2_34_x86_64.whl",
                   "wheel_sha256": "8e182e1c449197cb6f98716a7cf432a3ea7af78c172f9b840ab28ad9e6cda9b4",
                   "files": [hs, au, "python/sglang/srt/entrypoints/engine.py", "python/sglang/srt/server_args.py",
                             "python/sglang/srt/server_args_config_parser.py"],
                   "recorded_by": "tests/data/sglang_record_auth.py"},
        "keys_used_in_decisions": {"api_key": API, "admin_api_key": ADMIN},
        "headers": HEADERS,
        "paths": PATHS,
        "endpoints": "@ENDPOINTS@",
        "decision_columns": DECISION_COLUMNS,
        "decisions": "@DECISIONS@",
        "facts": {
            "open_prefixes": {"value": ["/health", "/metrics"],
                              "source": line_of(auth_py, 'path.startswith("/health") or path.startswith("/metrics")',
                                                au)},
            "header": {"value": "Authorization: Bearer <key> (scheme case-insensitive, split on the first space, "
                                "constant-time compare of the rest)",
                       "source": line_of(auth_py, "parts = authorization_header.split(\" \", 1)", au)},
            "refusal": {"value": {"401": {"error": "Unauthorized"}, "403": {"error": "Forbidden"}},
                        "source": line_of(auth_py, '"Unauthorized"', au)},
            "middleware_installed_when": {
                "value": "tokenizer_worker_num == 1 and (api_key or admin_api_key or an ADMIN_FORCE endpoint "
                         "exists); with more tokenizer workers no key is checked (and a worker asserts api_key is "
                         "None)",
                "source": [line_of(http_server, "if server_args.tokenizer_worker_num == 1:", hs),
                           line_of(http_server, "add_api_key_middleware(", hs),
                           line_of(http_server, '"API key is not supported in multi-tokenizer mode"', hs)]},
            "server_info_returns_server_args": {
                "value": "GET /server_info (a normal endpoint) answers dataclasses.asdict(server_args): api_key, "
                         "admin_api_key and ssl_keyfile_password included, in clear",
                "fields": ["api_key", "admin_api_key", "ssl_keyfile_password"],
                "source": line_of(http_server, "**dataclasses.asdict(server_args),", hs)},
            "server_args_logged": {
                "value": "the launch logs server_args=ServerArgs(...) at INFO, keys included",
                "source": line_of(engine_py, 'logger.info(f"{server_args=}")',
                                  "python/sglang/srt/entrypoints/engine.py")},
            "config_file": {
                "value": "--config FILE (.yaml/.yml, a mapping of flag names to values) is read by "
                         "prepare_server_args: its flags go before the command line's, so the command line wins",
                "source": [line_of(sa, 'if "--config" in argv:', "python/sglang/srt/server_args.py"),
                           line_of(cfg, "return config_args + before_config + after_config",
                                   "python/sglang/srt/server_args_config_parser.py"),
                           line_of(cfg, 'if path.suffix.lower() not in [".yaml", ".yml"]:',
                                   "python/sglang/srt/server_args_config_parser.py")]},
            "admin_api_key_help": {
                "value": "When set, admin endpoints require this key and do NOT accept --api-key.",
                "source": line_of(sa, "When set, admin endpoints require this key and do NOT accept --api-key.",
                                  "python/sglang/srt/server_args.py")},
        },
    }
    rows = ",\n  ".join(json.dumps(r) for r in decisions(auth_py))  # one decision a line
    eps = ",\n  ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in routes(http_server).items())
    text = json.dumps(record, indent=1).replace('"@DECISIONS@"', "[\n  " + rows + "\n ]")
    sys.stdout.write(text.replace('"@ENDPOINTS@"', "{\n  " + eps + "\n }") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
