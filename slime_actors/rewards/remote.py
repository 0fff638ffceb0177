"""A reward model behind HTTP (--rm-type remote_rm --rm-url URL).

Each sample is POSTed as JSON {"prompt", "response", "label", "metadata"}; the answer is {"reward": x} (or any
object, picked by --reward-key), or a bare number (JSON or plain text).

Connection errors, timeouts, HTTP 5xx, 408 and 429 are retried with exponential backoff and jitter: before attempt
k+1 it waits min(backoff_max, backoff_base * 2**(k-1)) scaled by a random factor in [0.5, 1). After
`max_attempts` attempts it raises RemoteRMError naming the URL, the attempts and the last error. Other 4xx answers
and bodies that are not a reward fail at once (retrying would not help) -- as does an answer of more than
MAX_ANSWER_BYTES (1 MiB), which is read no further: a reward is a number or a small object, and the reward
worker's memory is not the server's to fill.

The URL is --rm-url; --rm-max-attempts (5), --rm-timeout (60 s per attempt) and --rm-headers (a JSON object; ${NAME}
in a value is read from the reward worker's environment, so a token stays out of job files) set the rest; the
backoff (0.5 s base, 30 s at most) is `RemoteRMConfig`'s. A reward with settings of its own: `register_reward("judge", functools.partial(
remote_rm, config=RemoteRMConfig(url, headers={"Authorization": "Bearer ..."})))`.
One aiohttp session per event loop is shared by all requests; `await close_sessions()` at shutdown.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import weakref
from dataclasses import dataclass, field

import aiohttp

from slime_actors.http_answers import AnswerTooLarge, read_answer
from slime_actors.json_files import parse_json
from slime_actors.log import get_logger
from slime_actors.retry import RetryPolicy, retry

__all__ = ["RemoteRMConfig", "RemoteRMError", "remote_rm", "post_reward", "close_sessions"]

RETRY_STATUS = {408, 429}
MAX_ANSWER_BYTES = 1 << 20


class RemoteRMError(RuntimeError):
    """The remote reward model gave no usable answer (after retries where retrying made sense)."""


class _Retryable(Exception):
    pass


@dataclass
class RemoteRMConfig:
    url: str
    max_attempts: int = 5
    timeout: float = 60.0
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    headers: dict = field(default_factory=dict)

    @classmethod
    def from_args(cls, args, environ: dict | None = None) -> "RemoteRMConfig":
        """The settings of --rm-url, --rm-timeout, --rm-max-attempts and --rm-headers (`args`: the job's flat view;
        ${NAME} in a header value is taken from `environ`, default the process environment)."""
        if not args.rm_url:
            raise RemoteRMError("--rm-type remote_rm needs --rm-url")
        return cls(url=args.rm_url, max_attempts=max(1, int(args.rm_max_attempts)), timeout=float(args.rm_timeout),
                   headers=expand_headers(args.rm_headers, environ))

    @property
    def retry_policy(self) -> RetryPolicy:
        """max_attempts tries; after failed attempt n, a wait of backoff_base * 2**(n-1) (at most backoff_max),
        jittered into [0.5, 1) of it; on connection errors, timeouts and the statuses worth retrying."""
        return RetryPolicy(attempts=self.max_attempts, base=self.backoff_base, factor=2.0, max_delay=self.backoff_max,
                           jitter=0.5, retry_on=(_Retryable, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                                                 TimeoutError))


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_headers(text: str | None, environ: dict | None = None) -> dict[str, str]:
    """--rm-headers (a JSON object of strings) with each ${NAME} replaced by that environment variable, so that
    tokens stay out of the job's files and traces; RemoteRMError naming a variable that is not set."""
    if not text:
        return {}
    env = os.environ if environ is None else environ
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise RemoteRMError(f"--rm-headers is not a JSON object: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise RemoteRMError("--rm-headers must be a JSON object of strings")

    def sub(m):
        name = m.group(1)
        if name not in env:
            raise RemoteRMError(f"--rm-headers refers to ${{{name}}}, which is not set in the reward worker's "
                                "environment")
        return env[name]
    return {str(k): _ENV_REF.sub(sub, v) for k, v in raw.items()}


_sessions: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession]" = \
    weakref.WeakKeyDictionary()


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    s = _sessions.get(loop)
    if s is None or s.closed:
        s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, enable_cleanup_closed=True))
        _sessions[loop] = s
    return s


async def close_sessions() -> None:
    """Close this event loop's shared session (call before the loop ends)."""
    loop = asyncio.get_running_loop()
    s = _sessions.pop(loop, None)
    if s is not None and not s.closed:
        await s.close()


async def _read_answer(resp: aiohttp.ClientResponse, url: str, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """The answer's body, at most `limit` bytes (RemoteRMError past it: said by Content-Length, or found reading)."""
    try:
        return await read_answer(resp, limit)
    except AnswerTooLarge as exc:
        raise RemoteRMError(f"{url} answered HTTP {exc.status} with more than {limit:,} bytes; a reward is a number "
                            "or a small JSON object (not retried)") from None


def _parse_body(body: bytes, url: str):
    text = body.decode("utf-8", errors="replace").strip()
    try:
        value = parse_json(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise RemoteRMError(f"{url} answered {text[:200]!r}: not JSON and not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise RemoteRMError(f"{url} answered {text[:200]!r}: expected {{\"reward\": number}} or a number")
    return value


async def post_reward(cfg: RemoteRMConfig, payload: dict, *, log=None):
    """POST `payload` to cfg.url with retries; the parsed answer (a number or a dict)."""
    log = log or get_logger(component="remote_rm")
    session = _session()

    async def post():
        async with session.post(cfg.url, json=payload, headers=cfg.headers or None,
                                timeout=aiohttp.ClientTimeout(total=cfg.timeout)) as resp:
            body = await _read_answer(resp, cfg.url)
            if resp.status >= 500 or resp.status in RETRY_STATUS:
                raise _Retryable(f"HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')!r}")
            if resp.status >= 400:
                raise RemoteRMError(f"{cfg.url} answered HTTP {resp.status}: "
                                    f"{body[:200].decode('utf-8', 'replace')!r} (not retried)")
            return _parse_body(body, cfg.url)
    policy = cfg.retry_policy
    try:
        return await retry(post, policy, what="remote reward request", log=log, describe=_describe, url=cfg.url,
                           max_attempts=cfg.max_attempts)
    except policy.retry_on as exc:
        raise RemoteRMError(f"{cfg.url}: no reward after {cfg.max_attempts} attempts; last error: "
                            f"{_describe(exc)}") from None


def _describe(exc) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, _Retryable) else str(exc)


async def remote_rm(args, sample, config: RemoteRMConfig | None = None):
    """The remote reward model's answer for one sample (a number, or a dict for --reward-key), from --rm-url with
    the default settings, or from `config`."""
    cfg = config or RemoteRMConfig.from_args(args)
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
               "metadata": sample.metadata}
    return await post_reward(cfg, payload)
