"""Errors raised by the mailbox. Each one names the peer and method involved so a log line is enough to act on."""

from __future__ import annotations


class MailboxError(Exception):
    """Base class of every error the mailbox raises."""


class ProtocolError(MailboxError):
    """A frame or envelope that does not follow docs/wire-format.md."""


class MessageTooLarge(MailboxError):
    """A message whose encoded size exceeds the configured maximum."""


class AskTimeout(MailboxError, TimeoutError):
    """An ask that got no reply before its deadline."""

    def __init__(self, peer: str, method: str, timeout: float):
        self.peer, self.method, self.timeout = peer, method, timeout
        super().__init__(f"ask {peer}.{method} got no reply within {timeout:g}s")


class PeerDown(MailboxError, ConnectionError):
    """The peer an ask was waiting on was declared dead (missed heartbeats) or is not registered."""

    def __init__(self, peer: str, method: str | None = None, reason: str = "declared down"):
        self.peer, self.method, self.reason = peer, method, reason
        what = f"{peer}.{method}" if method else peer
        super().__init__(f"{what}: peer {reason}")


class RemoteError(MailboxError):
    """The peer answered an ask with an error envelope.

    `type` is the remote exception's class name, `message` its text; `peer` and `method` say where it happened.
    """

    def __init__(self, peer: str, method: str, type: str, message: str, traceback: str | None = None):
        self.peer, self.method, self.type, self.message, self.remote_traceback = peer, method, type, message, traceback
        super().__init__(f"{peer}.{method} failed: {type}: {message}")


class UnknownPeer(MailboxError, LookupError):
    """No endpoint is known for the actor name (not registered in the directory)."""


# error replies that say the handler did not finish (or never ran): the same ask sent again may succeed
TRANSIENT_REMOTE = frozenset(("MailboxError", "DeadlineExceeded"))


def transient(exc: BaseException) -> bool:
    """Whether the same ask may succeed if sent again: the peer could not be reached or answered nothing (restarting,
    declared down, a timeout), or it answered that it stopped while handling the ask (an error reply of type
    MailboxError) or that the ask's deadline had passed before its handler could run (DeadlineExceeded: a peer
    too busy to read it in time -- nothing was done). An error the peer's handler raised is not transient: asking
    again gets the same answer."""
    if isinstance(exc, RemoteError):
        return exc.type in TRANSIENT_REMOTE
    return isinstance(exc, MailboxError)
