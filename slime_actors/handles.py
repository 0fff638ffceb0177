"""Typed handles on other actors: one method per message their role declares in slime_actors/messages.py.

    buffer = BufferHandle(self, "buffer/0", retry_for=600)  # self: the actor that sends (its ask and tell)
    await buffer.start_rollout(k, weight_version=v)         # an ask: waits for the reply
    stats = await buffer.wait_rollout(k, timeout=86400.0, ask_timeout=86500)   # -> messages.RolloutStats
    trainers = TrainerGroup(TrainerHandle(self, f"trainer/{r}") for r in range(world))
    metrics = await trainers.train(k)                       # every rank at once; their replies in rank order
    await engines.tell.resume(weight_version=v)             # one-way messages (tell) to every engine
    await engines.quietly.pause(ask_timeout=60)             # a member that fails answers None instead of raising

The classes per role (`<Role>Handle`: asks to one actor, `<Role>Tell`: one-way messages, `<Role>Group`: asks to
several at once, `<Role>Quiet`: the same, a member that fails answering None) are generated from the declarations
into slime_actors/role_handles.py -- `python -m slime_actors.handles` writes it again after messages.py changed, and
tests/test_handles.py fails while it is stale -- so an editor's "go to definition" and a type checker see each
message's fields and reply type. This module is what their methods run.

A call is checked where it is written, before anything is sent: the method and its parameters are Python's (a
type checker finds a wrong name, a missing field or a wrong type before the code runs), and at run time the body
is checked against the declaration (a TypeError naming `role.method` and the field). Required fields may be given
by position (in their declared order), optional ones by name only; `ask_timeout` (keyword) bounds the ask, and
`idem` (keyword) is its idempotency key (the peer answers a repeated key from its cache). The body holds the fields
given in their declared order (an optional field left out is not sent), so the wire and the traces are those of a
hand-written `actor.ask(name, method, {...})`. The reply comes back as its declared type (`messages.Work`,
`Submitted`, a TypedDict whose keys are checked, ...): a reply lacking what its type needs is a ReplyError naming
the method.

`retry_for`: asks are sent again while the peer restarts (no answer, declared down, or it stopped while handling),
for up to that many seconds from the first failure -- for roles whose methods are idempotent (the buffer's). A call
to a group that fails on any member raises `GroupFailed`, naming the member; `confirmed` says the member is gone
(not merely an error its handler raised).
"""

from __future__ import annotations

import asyncio
import re
import textwrap
import time
from collections.abc import Awaitable, Iterable
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from .mailbox.errors import AskTimeout, MailboxError, PeerDown, RemoteError, UnknownPeer, transient
from .messages import CATALOG, BadRequest, MessageSpec
from .retry import RetryPolicy, retry

DEFAULT_ASK_TIMEOUT = 300.0
# `retry_for`: while the peer restarts (no answer, declared down, stopped while handling), until the deadline
RESTART_RETRY = RetryPolicy(attempts=None, deadline=600.0, base=0.4, max_delay=2.0, retry_on=(MailboxError,),
                            retry_if=transient)
# a handle's own names (and its class's): no message's; its methods' own parameters: no field's
OWN = frozenset(("name", "sender", "members", "names", "role", "quiet", "asks", "to", "tell", "quietly", "only"))
OWN_PARAMS = frozenset(("self", "ask_timeout", "idem", "fields"))


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # an optional field's default in a handle's method: left out, not sent


class Sender(Protocol):
    """What sends a handle's messages: an actor (or its mailbox)."""

    def ask(self, to: str, method: str, body: Any = None, *, timeout: float | None = None,
            idem: str | None = None) -> Awaitable[Any]: ...

    def tell(self, to: str, method: str, body: Any = None) -> Awaitable[Any]: ...


class GroupFailed(RuntimeError):
    """A call to a group failed on one member; `confirmed` when that member is gone (no answer, declared down, not
    registered, or it stopped while handling), not just an error its handler raised."""

    def __init__(self, method: str, member: str, exc: BaseException):
        super().__init__(f"{method}: {exc}")
        self.method, self.member, self.error = method, member, exc
        self.confirmed = isinstance(exc, (PeerDown, AskTimeout, UnknownPeer)) or (
            isinstance(exc, RemoteError) and exc.type == "MailboxError")


def spec_of(role: str, method: str) -> MessageSpec:
    """The declaration of `role.method` (a role's own, else every actor's)."""
    spec = CATALOG.get((role, method)) or CATALOG.get(("*", method))
    if spec is None:
        raise AttributeError(f"{role}.{method}: not declared in slime_actors/messages.py (slime_actors/role_handles.py "
                             "is stale: python -m slime_actors.handles)")
    return spec


class _Calls:
    """Base of the generated classes: their methods hand `_call` their arguments (`locals()`)."""

    role: ClassVar[str] = "*"
    asks: ClassVar[bool] = True  # False: one-way messages (no ask_timeout, no idem)

    def _call(self, method: str, args: dict[str, Any]) -> Awaitable[Any]:
        spec = spec_of(self.role, method)
        args.pop("self", None)
        ask_timeout, idem = args.pop("ask_timeout", None), args.pop("idem", None)
        if idem is not None and not isinstance(idem, str):
            raise TypeError(f"{spec.role}.{spec.method}: idem must be a str (an idempotency key), got "
                            f"{type(idem).__name__}")
        body = {k: v for k, v in args.items() if v is not UNSET}
        try:
            spec.check(body)
        except BadRequest as exc:
            raise TypeError(str(exc)) from None
        return self._send(spec, body, ask_timeout, idem)

    def _send(self, spec: MessageSpec, body: dict, ask_timeout: float | None, idem: str | None) -> Awaitable[Any]:
        raise NotImplementedError


class Handle(_Calls):
    """One actor, by name (`role/index`); `sender` is the actor that sends (anything with ask and tell)."""

    def __init__(self, sender: Sender, name: str, *, timeout: float = DEFAULT_ASK_TIMEOUT,
                 retry_for: float | None = None, log: Any = None):
        role, sep, index = name.partition("/")
        if not sep or not role or not index:
            raise ValueError(f"actor name {name!r} is not role/index")
        if self.role != "*" and role != self.role:
            raise ValueError(f"{name} is not a {self.role} actor (a {type(self).__name__} is for {self.role}/N)")
        self.sender, self.name = sender, name
        self._timeout, self._retry_for, self._log = timeout, retry_for, log

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def _send(self, spec: MessageSpec, body: dict, ask_timeout: float | None, idem: str | None) -> Awaitable[Any]:
        # (the key only when given: the sender's ask is called exactly as a hand-written one)
        kw: dict[str, Any] = {"timeout": self._timeout if ask_timeout is None else ask_timeout}
        if idem is not None:
            kw["idem"] = idem
        if self._retry_for is None and spec.read_reply is None:
            return self.sender.ask(self.name, spec.method, body, **kw)
        return self._ask(spec, body, kw)

    async def _ask(self, spec: MessageSpec, body: dict, kw: dict) -> Any:
        def ask() -> Awaitable[Any]:
            return self.sender.ask(self.name, spec.method, body, **kw)
        if self._retry_for is None:
            reply = await ask()
        else:
            # (the sender's clock: an actor's readings are recorded, so a replay takes the same turns)
            reply = await retry(ask, RESTART_RETRY.replace(deadline=self._retry_for), what=f"{self.name} {spec.method}",
                                log=self._log, clock=getattr(self.sender, "monotonic", time.monotonic))
        return reply if spec.read_reply is None else spec.read_reply(reply)

    def _tell(self, spec: MessageSpec, body: dict) -> Awaitable[Any]:
        return self.sender.tell(self.name, spec.method, body)


H = TypeVar("H", bound=Handle)


class Group(_Calls, Generic[H]):
    """Actors of one role; a call goes to each member at once and returns their replies in member order (`quiet`:
    a member that fails with a mailbox error -- gone, timed out, its handler raised -- answers None)."""

    quiet: ClassVar[bool] = False

    def __init__(self, members: Iterable[H]):
        self.members: list[H] = list(members)  # (a generator is read once, here)
        wrong = [m.name for m in self.members if m.role != self.role]
        if wrong:
            raise ValueError(f"a {type(self).__name__}'s members must be {self.role} actors, got {', '.join(wrong)}")

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def only(self, names: Iterable[str]) -> Self:
        """The members named (in member order), as a group of the same kind."""
        keep = set(names)
        unknown = keep - set(self.names)
        if unknown:
            raise ValueError(f"{', '.join(sorted(unknown))}: not members of this {self.role} group ({self.names})")
        return type(self)([m for m in self.members if m.name in keep])

    def __len__(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.names}>"

    def _send(self, spec: MessageSpec, body: dict, ask_timeout: float | None, idem: str | None) -> Awaitable[Any]:
        return fan_out(spec.method, self.members, [m._send(spec, body, ask_timeout, idem) for m in self.members],
                       self.quiet)


class Tell(_Calls):
    """One-way messages (no reply, no waiting for one) to one actor or to every member of a group (`quiet`: a member
    that cannot be told is left out instead of raising GroupFailed)."""

    asks = False

    def __init__(self, to: Handle | Group, quiet: bool = False):
        self.to, self._quiet = to, quiet

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.to!r}>"

    def _send(self, spec: MessageSpec, body: dict, ask_timeout: float | None, idem: str | None) -> Awaitable[Any]:
        if isinstance(self.to, Handle):
            return _nothing(self.to._tell(spec, body))
        members = self.to.members
        return fan_out(spec.method, members, [m._tell(spec, body) for m in members], self._quiet, replies=False)


async def _nothing(call: Awaitable[Any]) -> None:
    await call


def fan_out(method: str, members: list, calls: list[Awaitable[Any]], quiet: bool,
            replies: bool = True) -> Awaitable[Any]:
    """Every call at once; their results in member order (None where one failed, when `quiet`), or GroupFailed
    naming the first member that failed. `replies` False (tells): nothing.

    The calls start here, as tasks, not when the result is awaited: each member's message goes out at the loop's
    next turn, like a single actor's ask started with `asyncio.ensure_future` (a caller that starts a group's ask
    and goes on with other work -- the controller's `alongside` -- does not hold it back until it next waits).
    Called outside a running event loop, they start when the result is awaited."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _start_then_collect(method, members, calls, quiet, replies)
    return _collect(method, members, _start(calls, quiet), quiet, replies)


def _start(calls: list[Awaitable[Any]], quiet: bool) -> list[asyncio.Future[Any]]:
    return [asyncio.ensure_future(_quiet(c) if quiet else c) for c in calls]


async def _start_then_collect(method: str, members: list, calls: list[Awaitable[Any]], quiet: bool,
                              replies: bool) -> Any:
    return await _collect(method, members, _start(calls, quiet), quiet, replies)


async def _collect(method: str, members: list, tasks: list[asyncio.Future[Any]], quiet: bool, replies: bool) -> Any:
    try:
        if tasks:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for member, t in zip(members, tasks):
            exc = t.exception() if t.done() else None
            if exc is not None:  # (quiet: not a mailbox error -- a member that fails so answers None --, raised)
                if quiet:
                    raise exc
                raise GroupFailed(method, member.name, exc) from exc
        return [t.result() for t in tasks] if replies else None
    finally:
        for t in tasks:  # (the others' outcomes -- a second member's error, a cancelled ask -- are not news)
            if not t.done():
                t.cancel()
            t.add_done_callback(outcome_seen)


def outcome_seen(task: asyncio.Future[Any]) -> None:
    """A done callback for a task whose outcome nobody will await (it was stopped, or another error is the one
    raised): marks its error as retrieved, so asyncio does not log "Task exception was never retrieved" for it."""
    if not task.cancelled():
        task.exception()


async def _quiet(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except MailboxError:
        return None


# ------------------------------------------------------------------------------------------------------------------
# slime_actors/role_handles.py, generated from the declarations

GENERATED = "slime_actors/role_handles.py"
_BUILTIN_NAMES = frozenset(("int", "float", "str", "bool", "bytes", "list", "dict", "None", "Any"))

# (suffix, base class, what it is, how a reply of type R comes back)
_KINDS = (("Handle", "ActorHandle", "Asks to one {role} actor (`{role}/N`): each method sends its message and waits "
           "for the reply.", "Awaitable[{r}]"),
          ("Tell", "ActorTell", "One-way messages to one {role} actor or to every member of a group (no reply).",
           "Awaitable[None]"),
          ("Group", "Group[{cls}Handle]", "Asks to several {role} actors at once: their replies in member order "
           "(GroupFailed when one fails).", "Awaitable[{list}[{r}]]"),
          ("Quiet", "Group[{cls}Handle]", "Asks to several {role} actors at once; a member that fails answers None.",
           "Awaitable[{list}[{r} | None]]"))
_EVERY_ACTOR = (("Handle", "Handle", "Asks to any actor: the built-in messages every actor takes (each role's handle "
                 "derives from this class)."),
                ("Tell", "Tell", "One-way messages to any actor: the built-in ones (each role's Tell derives from "
                 "this class)."))


def generate() -> str:
    """The text of slime_actors/role_handles.py: per declared role, its Handle, Tell, Group and Quiet classes (every
    actor's built-in messages in ActorHandle and ActorTell, which the roles' derive from)."""
    roles = [r for r in dict.fromkeys(r for r, _ in CATALOG) if r != "*"]
    names: set[str] = set()
    for spec in CATALOG.values():
        for text in [a for _, a in spec.annotations] + [spec.returns]:
            names.update(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
    imports = sorted(names - _BUILTIN_NAMES)
    out = ['"""Typed handles per role, generated from slime_actors/messages.py by `python -m slime_actors.handles`: do',
           'not edit (tests/test_handles.py fails when this file is stale). What the methods run: handles.py."""',
           "", "from __future__ import annotations", "", "import builtins", "from collections.abc import Awaitable",
           "from typing import Any", "", "from .handles import UNSET, Group, Handle, Tell"]
    out += _wrap(f"from .messages import ({', '.join(imports)})", " " * len("from .messages import (")) if imports \
        else []
    for s in CATALOG.values():
        bad = ({s.method} & OWN) | ({n for n, _ in s.annotations} & OWN_PARAMS)
        if bad:
            raise ValueError(f"{s.role}.{s.method}: a message (or field) named {sorted(bad)[0]!r} would hide the "
                             "handle's own")
    every = [s for (r, _), s in CATALOG.items() if r == "*"]
    for suffix, base, what in _EVERY_ACTOR:
        out += ["", "", f"class Actor{suffix}({base}):"] + _doc(what, 4)
        out += ["", '    role = "*"']
        for s in every:
            out += [""] + _method(s, suffix, "Awaitable[{r}]" if suffix == "Handle" else "Awaitable[None]")
    for role in roles:
        specs = [s for (r, _), s in CATALOG.items() if r == role]
        cls = role.capitalize()
        # (a message named `list` would shadow the builtin in its class: the groups' replies say builtins.list)
        lst = "builtins.list" if any(s.method == "list" for s in specs) else "list"
        for suffix, base, what, shape in _KINDS:
            out += ["", "", f"class {cls}{suffix}({base.format(cls=cls)}):"] + _doc(what.format(role=role), 4)
            out += ["", f'    role = "{role}"'] + (["    quiet = True"] if suffix == "Quiet" else [])
            out += _properties(cls, suffix)
            for s in specs:
                out += [""] + _method(s, suffix, shape.replace("{list}", lst))
    return "\n".join(out) + "\n"


def _properties(cls: str, suffix: str) -> list[str]:
    if suffix == "Handle":
        return ["", "    @property", f"    def tell(self) -> {cls}Tell:", f"        return {cls}Tell(self)"]
    if suffix == "Tell":
        return ["", "    @property", f"    def quietly(self) -> {cls}Tell:",
                '        """The same members; one that cannot be told is left out."""',
                f"        return {cls}Tell(self.to, quiet=True)"]
    if suffix == "Group":
        return ["", "    @property", f"    def tell(self) -> {cls}Tell:", f"        return {cls}Tell(self)",
                "", "    @property", f"    def quietly(self) -> {cls}Quiet:", f"        return {cls}Quiet(self.members)"]
    return []


def _method(spec: MessageSpec, suffix: str, shape: str) -> list[str]:
    required = {n for n, f in spec.fields.items() if f.required}
    params = ["self"] + [f"{n}: {a}" for n, a in spec.annotations if n in required]
    optional = [f"{n}: {a} = UNSET" for n, a in spec.annotations if n not in required]
    asks = suffix != "Tell"
    extra = ["ask_timeout: float | None = None", "idem: str | None = None"] if asks else []
    if optional or extra:
        params += ["*"] + optional + extra
    if spec.open:
        params.append("**fields: Any")
    ret = shape.format(r=spec.returns)
    head = f"    def {spec.method}("
    lines = _wrap(head + ", ".join(params) + f") -> {ret}:", " " * len(head))
    doc = spec.doc + (f"\n\nReply: {spec.reply}." if asks and spec.reply != "nothing" else "")
    body = '        return self._call("%s", locals())' % spec.method
    if spec.open:
        body = '        return self._call("%s", {**locals(), **locals()["fields"]})' % spec.method
    return lines + _doc(doc, 8) + [body]


def _doc(text: str, indent: int) -> list[str]:
    pad = " " * indent
    paras = [textwrap.fill(p, 116 - indent, initial_indent="", subsequent_indent="", break_on_hyphens=False)
             for p in text.split("\n\n")]
    lines = "\n\n".join(paras).split("\n")
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return [pad + x if x else "" for x in lines]


def _wrap(line: str, pad: str, width: int = 120) -> list[str]:
    """A long line broken after the commas that separate its items (not those inside brackets), the continuation
    lines indented with `pad`."""
    if len(line) <= width:
        return [line]
    parts, depth, cur = [], 0, ""
    for ch in line:
        cur += ch
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 1:
            parts.append(cur)
            cur = ""
    parts.append(cur)
    out, cur = [], ""
    for part in parts:
        if cur and len(cur) + len(part.rstrip()) > width:
            out.append(cur.rstrip())
            cur = pad + part.lstrip()
        else:
            cur += part
    return out + [cur]


def main(argv: list[str] | None = None) -> int:
    """`python -m slime_actors.handles`: write slime_actors/role_handles.py again (`--check`: only say whether it is
    current)."""
    import argparse
    from pathlib import Path
    ap = argparse.ArgumentParser(prog="python -m slime_actors.handles", description=main.__doc__)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    path = Path(__file__).with_name("role_handles.py")
    text = generate()
    current = path.exists() and path.read_text() == text
    if args.check:
        print(f"{GENERATED} is {'current' if current else 'stale: python -m slime_actors.handles'}")
        return 0 if current else 1
    if not current:
        path.write_text(text)
    print(f"{GENERATED}: {'unchanged' if current else 'written'}")
    return 0


__all__ = ["Handle", "Group", "Tell", "GroupFailed", "UNSET", "Sender", "spec_of", "generate"]

if __name__ == "__main__":
    raise SystemExit(main())
