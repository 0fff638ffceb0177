"""The job's config as every launcher builds it, once, in the head: flags + TOML + topology, then the backends'
checks.

    cfg, changed = build_job_config(argv, topology)   # ConfigError / TopologyError naming the problem

1. the topology's `[job] config` file, unless the command line names one (`--config`);
2. the flags and the TOML file: types, defaults, derived values, the values' checks (slime_actors.config);
3. the topology's counts (it wins over the flags; `changed` says what it changed);
4. what the backends own: the engine keys the user gave are taken out of the config (`cfg.engine_user_keys`, never
   written anywhere from the config), and the `--sglang-*` / `--router-*` passthrough is checked against SGLang's
   own parser or its recorded flag table.
"""

from __future__ import annotations

from ..backends.engine_auth import EngineKeyError, take_user_keys
from ..backends.sglang_launch import SGLangFlagError, check_passthrough
from ..config import ConfigError, JobConfig, has_flag, parse_config
from .topology import Topology


def build_job_config(argv: list[str], topology: Topology | None = None) -> tuple[JobConfig, list[str]]:
    """The job's typed config; what the topology changed ("--flag old -> new")."""
    argv = list(argv)
    if topology is not None and topology.job_config and not has_flag(argv, "--config"):
        argv = ["--config", topology.job_config] + argv
    cfg = parse_config(argv)
    changed = topology.apply_to_config(cfg) if topology is not None else []
    check_backend_flags(cfg)
    return cfg, changed


def check_backend_flags(cfg: JobConfig) -> None:
    """Take the user's engine keys out of the config and check the SGLang passthrough (ConfigError)."""
    try:
        cfg.engine_user_keys = take_user_keys(cfg.engine)
    except EngineKeyError as exc:
        raise ConfigError(str(exc)) from None
    eng = cfg.engine
    if eng.sglang_args or eng.router_args or eng.rollout_engine == "sglang" or eng.use_sglang_router:
        try:
            check_passthrough(cfg)
        except SGLangFlagError as exc:
            raise ConfigError(str(exc)) from None
