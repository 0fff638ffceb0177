"""Typed handles on other actors: one method per message their role declares in slime_actors/messages.py.

    buffer = Handle(self, "buffer/0", retry_for=600)        # self: the actor that sends (its ask and tell)
    await buffer.start_rollout(k, weight_version=v)         # an ask: waits for the reply
    stats = await buffer.wait_rollout(k, timeout=86400.0, ask_timeout=86500)   # -> messages.RolloutStats
    trainers = Group(Handle(self, f"trainer/{r}") for r in range(world))
    metrics = await trainers.train(k)                       # every rank at once; their replies in rank order
    await engines.tell.resume(weight_version=v)             # one-way messages (tell) to every engine
    await engines.quietly.pause(ask_timeout=60)             # a member that fails answers None instead of raising

A call is checked where it is written, before anything is sent: a method its role does not declare is an
AttributeError, a missing, unknown or mistyped field a TypeError, each naming `role.method`. Required fields may be
given by position (in their declared order), optional ones by name only; `ask_timeout` (keyword) bounds the ask. The
body holds exactly the fields given, in the order given (an optional field left out is not sent), so the wire and the
traces are those of a hand-written `actor.ask(name, method, {...})`. A reply declared with a type (`returns=` in
messages.py) comes back as that type.

`retry_for`: asks are sent again while the peer restarts (no answer, declared down, or it stopped while handling),
for up to that many seconds from the first failure -- for roles whose methods are idempotent (the buffer's). A call
to a `Group` that fails on any member raises `GroupFailed`, naming the member; `confirmed` says the member is gone
(not merely an error its handler raised).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterable

from .mailbox.errors import AskTimeout, MailboxError, PeerDown, RemoteError, UnknownPeer, transient
from .messages import CATALOG, BadRequest, MessageSpec
from .retry import RetryPolicy, retry

DEFAULT_ASK_TIMEOUT = 300.0
# `retry_for`: while the peer restarts (no answer, declared down, stopped while handling), until the deadline
RESTART_RETRY = RetryPolicy(attempts=None, deadline=600.0, base=0.4, max_delay=2.0, retry_on=(MailboxError,),
                            retry_if=transient)
_OWN = frozenset(("name", "sender", "members", "ask_timeout"))  # a handle's own names (and its class's): no message's
_classes: dict[tuple[type, str], type] = {}


class GroupFailed(RuntimeError):
    """A call to a group failed on one member; `confirmed` when that member is gone (no answer, declared down, not
    registered, or it stopped while handling), not just an error its handler raised."""

    def __init__(self, method: str, member: str, exc: BaseException):
        super().__init__(f"{method}: {exc}")
        self.method, self.member, self.error = method, member, exc
        self.confirmed = isinstance(exc, (PeerDown, AskTimeout, UnknownPeer)) or (
            isinstance(exc, RemoteError) and exc.type == "MailboxError")


def specs_of(role: str) -> dict[str, MessageSpec]:
    """The messages an actor of `role` handles: its role's declarations and every actor's built-ins."""
    specs = {m: s for (r, m), s in CATALOG.items() if r == "*"}
    own = {m: s for (r, m), s in CATALOG.items() if r == role}
    if not own:
        roles = sorted({r for r, _ in CATALOG if r != "*"})
        raise ValueError(f"no messages are declared for role {role!r} in slime_actors/messages.py "
                         f"(roles: {', '.join(roles)})")
    specs.update(own)
    return specs


class _Calls:
    """Base of the generated classes: `_send(spec, body, ask_timeout)` is what a call does with its checked body."""

    role: str = ""

    def __new__(cls, *args, **kwargs):
        if cls in (Handle, Group):
            role = cls._role_of(*args, **kwargs)
            cls = _classes.get((cls, role)) or _generate(cls, role)
        return object.__new__(cls)

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)
        known = ", ".join(sorted(m for m in specs_of(self.role) if not m.startswith("_")))
        raise AttributeError(f"{self.role}.{method}: role {self.role!r} declares no message {method!r} in "
                             f"slime_actors/messages.py (it has: {known})")

    def _send(self, spec: MessageSpec, body: dict, ask_timeout: float | None):
        raise NotImplementedError


def _generate(base: type, role: str) -> type:
    methods = {}
    for method, spec in specs_of(role).items():
        clash = method in _OWN or hasattr(base, method) or "ask_timeout" in spec.fields
        if clash:
            raise ValueError(f"{role}.{method}: a message (or field) of that name would hide the handle's own "
                             f"{'ask_timeout' if 'ask_timeout' in spec.fields else method!r}")
        methods[method] = _method(spec)
    cls = type(f"{role.capitalize()}{base.__name__}", (base,), {"role": role, **methods})
    _classes[(base, role)] = cls
    return cls


def _method(spec: MessageSpec):
    """A method whose signature is the declaration: required fields positional-or-keyword, in declared order;
    optional ones keyword-only; open declarations (a handler taking **kwargs) any further keyword."""
    P = inspect.Parameter
    required = [n for n, f in spec.fields.items() if f.required]
    params = [P(n, P.POSITIONAL_OR_KEYWORD) for n in required]
    params += [P(n, P.KEYWORD_ONLY, default=None) for n, f in spec.fields.items() if not f.required]
    params.append(P("ask_timeout", P.KEYWORD_ONLY, default=None))
    if spec.open:
        params.append(P("fields", P.VAR_KEYWORD))
    sig = inspect.Signature(params)
    where = f"{spec.role}.{spec.method}"
    declared = ", ".join(f"{n}{'' if f.required else '?'}: {f.type}" for n, f in spec.fields.items()) or "none"

    def call(self, *args, **kwargs):
        unknown = [k for k in kwargs if k not in spec.fields and k != "ask_timeout"] if not spec.open else []
        if unknown:
            raise TypeError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))} (declared fields: {declared})")
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{where}: {exc} (declared fields: {declared})") from None
        ask_timeout = kwargs.pop("ask_timeout", None)
        body = dict(zip(required, args))
        body.update(kwargs)
        try:
            spec.check(body)
        except BadRequest as exc:
            raise TypeError(str(exc)) from None
        return self._send(spec, body, ask_timeout)

    call.__name__ = spec.method
    call.__qualname__ = where
    call.__doc__ = f"{spec.doc}\n\nReply: {spec.reply or 'nothing'}."
    call.__signature__ = sig.replace(parameters=[P("self", P.POSITIONAL_OR_KEYWORD), *params])
    return call


class Handle(_Calls):
    """One actor, by name (`role/index`); `sender` is the actor that sends (anything with ask and tell)."""

    @staticmethod
    def _role_of(sender, name: str, **kw) -> str:
        role, sep, index = name.partition("/")
        if not sep or not role or not index:
            raise ValueError(f"actor name {name!r} is not role/index")
        return role

    def __init__(self, sender, name: str, *, timeout: float = DEFAULT_ASK_TIMEOUT, retry_for: float | None = None,
                 one_way: bool = False, log=None):
        self.sender, self.name = sender, name
        self._timeout, self._retry_for, self._one_way, self._log = timeout, retry_for, one_way, log

    @property
    def tell(self) -> Handle:
        """The same actor, sent one-way messages (no reply, no waiting for one)."""
        return Handle(self.sender, self.name, one_way=True)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}{' (tell)' if self._one_way else ''}>"

    def _send(self, spec: MessageSpec, body: dict, ask_timeout: float | None):
        if self._one_way:
            return self.sender.tell(self.name, spec.method, body)
        timeout = self._timeout if ask_timeout is None else ask_timeout
        if self._retry_for is None and spec.returns is None:
            return self.sender.ask(self.name, spec.method, body, timeout=timeout)
        return self._ask(spec, body, timeout)

    async def _ask(self, spec: MessageSpec, body: dict, timeout: float):
        def ask():
            return self.sender.ask(self.name, spec.method, body, timeout=timeout)
        if self._retry_for is None:
            reply = await ask()
        else:
            # (the sender's clock: an actor's readings are recorded, so a replay takes the same turns)
            reply = await retry(ask, RESTART_RETRY.replace(deadline=self._retry_for), what=f"{self.name} {spec.method}",
                                log=self._log, clock=getattr(self.sender, "monotonic", time.monotonic))
        return reply if spec.returns is None else spec.returns.from_wire(reply)


class Group(_Calls):
    """Actors of one role; a call goes to each member at once and returns their replies in member order."""

    def __new__(cls, members: Iterable[Handle], *, quiet: bool = False):
        members = list(members)  # (a generator is read once, here)
        obj = super().__new__(cls, members)
        obj.members = members
        return obj

    @staticmethod
    def _role_of(members: list[Handle]) -> str:
        roles = {m.role for m in members}
        if len(roles) != 1:
            raise ValueError(f"a group's members must be of one role, got {sorted(roles) or 'no members'}")
        return roles.pop()

    def __init__(self, members: Iterable[Handle], *, quiet: bool = False):
        self._quiet = quiet  # (members: set by __new__)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    @property
    def tell(self) -> Group:
        """The same members, sent one-way messages."""
        return Group([m.tell for m in self.members], quiet=self._quiet)

    @property
    def quietly(self) -> Group:
        """The same members; one that fails with a mailbox error (gone, timed out, its handler raised) answers None."""
        return Group(self.members, quiet=True)

    def only(self, names: Iterable[str]) -> Group:
        """The members named (in member order)."""
        keep = set(names)
        unknown = keep - set(self.names)
        if unknown:
            raise ValueError(f"{', '.join(sorted(unknown))}: not members of this {self.role} group ({self.names})")
        return Group([m for m in self.members if m.name in keep], quiet=self._quiet)

    def __len__(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.names}>"

    def _send(self, spec: MessageSpec, body: dict, ask_timeout: float | None):
        return self._fan_out(spec, body, ask_timeout)

    async def _fan_out(self, spec: MessageSpec, body: dict, ask_timeout: float | None) -> list:
        calls = [m._send(spec, body, ask_timeout) for m in self.members]
        if self._quiet:
            return list(await asyncio.gather(*(_quiet(c) for c in calls)))
        tasks = [asyncio.ensure_future(c) for c in calls]
        try:
            if tasks:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for member, t in zip(self.members, tasks):
                if t.done() and t.exception() is not None:
                    raise GroupFailed(spec.method, member.name, t.exception()) from t.exception()
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()


async def _quiet(call):
    try:
        return await call
    except MailboxError:
        return None


__all__ = ["Handle", "Group", "GroupFailed", "specs_of"]
