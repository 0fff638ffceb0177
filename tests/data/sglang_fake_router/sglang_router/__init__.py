"""A stand-in for the sglang-router package (tests only): the same module names, `RouterArgs.add_cli_args` shaped like
sglang-router 0.3.2's, and a small aiohttp router speaking its worker API (POST/GET /workers, DELETE
/workers/{id}, /health) that forwards /generate round-robin to the registered workers. Keys as sglang-router 0.3.2
takes them: `--api-key` guards /generate (Authorization: Bearer), `--control-plane-api-keys ID:NAME:ROLE:KEY` guard
/workers (an admin key), and a worker is called with the api_key it was registered with."""
__version__ = "0.0.0.fake"
