"""The two chat APIs agents are written against, as data: OpenAI's Chat Completions and Anthropic's Messages.

    req = parse_openai(body)            # ChatRequest, or WireError (status, message, param) for a bad body
    req = parse_anthropic(body)
    openai_reply(req, text, finish, n_in, n_out) / openai_chunks(...)          # the JSON answer / its SSE stream
    anthropic_reply(req, text, finish, n_in, n_out) / anthropic_events(...)
    openai_error(exc) / anthropic_error(exc)                                    # each API's error body

What is served is text: the model's turn decoded. Tool definitions in a request reach the chat template (the
model sees them as the template renders them), but the model's output is not parsed into tool calls (no parser of
a model's tool-call format here: an agent that needs them parses the text). Message content may be a string or a
list of text blocks (both APIs); images and other blocks are refused. Names follow slime's adapters
(slime/agent/adapters): an OpenAI `developer` message is a system message, Anthropic's `system` is the first
message, a `tool` / `tool_result` turn is a tool message.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

MAX_MESSAGES = 4096
MAX_TOKENS = 1 << 20
ROLES = ("system", "user", "assistant", "tool")


class WireError(ValueError):
    """A request the API refuses: HTTP `status`, a message naming the problem, the field (`param`)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


@dataclass
class ChatRequest:
    messages: list[dict]                 # {"role", "content": str} as a chat template takes them
    tools: list[dict] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    model: str = "policy"

    def sampling_params(self, budget: int) -> dict:
        """SGLang's sampling params for this request; `budget`: the most new tokens allowed."""
        sp: dict[str, Any] = {"max_new_tokens": min(budget, self.max_tokens or budget)}
        if self.temperature is not None:
            sp["temperature"] = self.temperature
        if self.top_p is not None:
            sp["top_p"] = self.top_p
        if self.stop:
            sp["stop"] = list(self.stop)
        return sp


# ------------------------------------------------------------------------------------------------ parsing
def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text blocks ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for i, b in enumerate(content):
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, dict) and b.get("type") in ("text", "input_text", "output_text") \
                    and isinstance(b.get("text"), str):
                parts.append(b["text"])
            elif isinstance(b, dict) and b.get("type") == "tool_result":
                parts.append(_text(b.get("content"), f"{where}[{i}].content"))
            else:
                kind = b.get("type") if isinstance(b, dict) else type(b).__name__
                raise WireError(f"{where}[{i}]: content blocks of type {kind!r} are not supported (text only)",
                                param=f"{where}[{i}]")
        return "\n".join(parts)
    raise WireError(f"{where} must be a string or a list of content blocks, got {type(content).__name__}",
                    param=where)


def _common(body: Any, api: str) -> dict:
    if not isinstance(body, dict):
        raise WireError(f"the request body must be a JSON object ({api})")
    out: dict[str, Any] = {}
    model = body.get("model", "policy")
    if not isinstance(model, str):
        raise WireError("model must be a string", param="model")
    out["model"] = model
    for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        v = body.get(name)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise WireError(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}", param=name)
            out[name] = float(v)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise WireError(f"stream must be true or false, got {stream!r}", param="stream")
    out["stream"] = stream
    return out


def _max_tokens(v: Any, name: str, required: bool) -> int | None:
    if v is None:
        if required:
            raise WireError(f"{name}: Field required", param=name)
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
        raise WireError(f"{name} must be an integer in [1, {MAX_TOKENS}], got {v!r}", param=name)
    return v


def _stops(v: Any, name: str) -> list[str]:
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise WireError(f"{name} must be a non-empty string or a list of at most 16 of them", param=name)
    return list(stops)


def _tools(v: Any, anthropic: bool) -> list[dict] | None:
    """Tool definitions in the chat template's form ({"type": "function", "function": {name, description,
    parameters}})."""
    if v is None:
        return None
    if not isinstance(v, list):
        raise WireError("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(v):
        fn = t.get("function") if isinstance(t, dict) and not anthropic else t
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise WireError(f"tools[{i}] needs a name", param=f"tools[{i}]")
        params = fn.get("input_schema" if anthropic else "parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                                      "parameters": params}})
    return out or None


def _messages(body: dict, anthropic: bool) -> list:
    """The body's messages: a non-empty list of at most MAX_MESSAGES (each API's wording of the refusal)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise WireError("messages: must be a non-empty list" if anthropic else "messages must be a non-empty list",
                        param="messages")
    if len(msgs) > MAX_MESSAGES:
        raise WireError(f"messages: at most {MAX_MESSAGES}" if anthropic else f"at most {MAX_MESSAGES} messages",
                        param="messages")
    return msgs


def parse_openai(body: Any) -> ChatRequest:
    """A Chat Completions body, checked."""
    common = _common(body, "POST /v1/chat/completions")
    msgs = _messages(body, anthropic=False)
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise WireError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ROLES:
            raise WireError(f"messages[{i}].role must be one of system, developer, user, assistant, tool; got "
                            f"{m.get('role')!r}", param=f"messages[{i}].role")
        out.append({"role": role, "content": _text(m.get("content"), f"messages[{i}].content")})
    n = body.get("n", 1)
    if n != 1:
        raise WireError("n must be 1 (one completion per request)", param="n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(out, _tools(body.get("tools"), False),
                       _max_tokens(max_tokens, "max_completion_tokens", False), common.get("temperature"),
                       common.get("top_p"), _stops(body.get("stop"), "stop"), common["stream"], common["model"])


def parse_anthropic(body: Any) -> ChatRequest:
    """A Messages body, checked (max_tokens is required, as Anthropic's API has it)."""
    common = _common(body, "POST /v1/messages")
    msgs = _messages(body, anthropic=True)
    out = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise WireError(f"messages.{i}.role: must be 'user' or 'assistant'", param=f"messages.{i}.role")
        content = m.get("content")
        if m["role"] == "user" and isinstance(content, list) and content and all(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            out.append({"role": "tool", "content": _text(content, f"messages.{i}.content")})
        else:
            out.append({"role": m["role"], "content": _text(content, f"messages.{i}.content")})
    return ChatRequest(out, _tools(body.get("tools"), True), _max_tokens(body.get("max_tokens"), "max_tokens", True),
                       common.get("temperature"), common.get("top_p"),
                       _stops(body.get("stop_sequences"), "stop_sequences"), common["stream"], common["model"])


# ------------------------------------------------------------------------------------------------ answers
def openai_finish(finish: str) -> str:
    return "length" if finish == "length" else "stop"


def openai_reply(req: ChatRequest, text: str, finish: str, n_in: int, n_out: int) -> dict:
    return {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion", "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": openai_finish(finish)}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}}


def openai_chunks(req: ChatRequest, text: str, finish: str, n_in: int, n_out: int) -> Iterator[bytes]:
    """The answer as Chat Completions' SSE stream (the whole turn is generated first: one content chunk)."""
    cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())

    def chunk(delta: dict, fin: str | None = None, usage: dict | None = None) -> bytes:
        d = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": fin}]}
        if usage is not None:
            d["usage"] = usage
        return f"data: {json.dumps(d)}\n\n".encode()
    yield chunk({"role": "assistant", "content": ""})
    if text:
        yield chunk({"content": text})
    yield chunk({}, openai_finish(finish),
                {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out})
    yield b"data: [DONE]\n\n"


def anthropic_stop(finish: str) -> str:
    return "max_tokens" if finish == "length" else "end_turn"


def anthropic_reply(req: ChatRequest, text: str, finish: str, n_in: int, n_out: int) -> dict:
    return {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant", "model": req.model,
            "content": [{"type": "text", "text": text}], "stop_reason": anthropic_stop(finish),
            "stop_sequence": None, "usage": {"input_tokens": n_in, "output_tokens": n_out}}


def anthropic_events(req: ChatRequest, text: str, finish: str, n_in: int, n_out: int) -> Iterator[bytes]:
    """The answer as Messages' SSE stream: message_start, one text block, message_delta, message_stop."""
    def ev(name: str, data: dict) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    msg = anthropic_reply(req, "", finish, n_in, 0)
    msg.update(content=[], stop_reason=None)
    yield ev("message_start", {"type": "message_start", "message": msg})
    yield ev("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}})
    if text:
        yield ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": text}})
    yield ev("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": anthropic_stop(finish),
                                                                  "stop_sequence": None},
                               "usage": {"output_tokens": n_out}})
    yield ev("message_stop", {"type": "message_stop"})


def openai_error(exc: WireError) -> dict:
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": None}}


def anthropic_error(exc: WireError) -> dict:
    kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}.get(exc.status, exc.kind)
    return {"type": "error", "error": {"type": kind, "message": str(exc)}}
