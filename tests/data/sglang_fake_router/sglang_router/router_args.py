import dataclasses


@dataclasses.dataclass
class RouterArgs:
    """The flags of sglang-router 0.3.2's RouterArgs.add_cli_args that the tests use (prefix "router-" inside slime)."""
    host: str = "127.0.0.1"
    port: int = 30000

    @staticmethod
    def add_cli_args(parser, use_router_prefix=False, exclude_host_port=False):
        prefix = "router-" if use_router_prefix else ""
        if not exclude_host_port:
            parser.add_argument("--host", type=str, default=RouterArgs.host)
            parser.add_argument("--port", type=int, default=RouterArgs.port)
        parser.add_argument("--worker-urls", type=str, nargs="*", default=[])
        parser.add_argument(f"--{prefix}policy", type=str, default="cache_aware",
                            choices=["random", "round_robin", "cache_aware", "power_of_two"])
        parser.add_argument(f"--{prefix}disable-health-check", action="store_true")
        parser.add_argument(f"--{prefix}disable-circuit-breaker", action="store_true")
        parser.add_argument(f"--{prefix}prometheus-port", type=int, default=29000)
        parser.add_argument(f"--{prefix}prometheus-host", type=str, default="0.0.0.0")
        parser.add_argument(f"--{prefix}log-level", type=str, default="info")
        parser.add_argument(f"--{prefix}api-key", type=str, default=None)
        parser.add_argument(f"--{prefix}control-plane-api-keys", type=str, nargs="*", default=[])
