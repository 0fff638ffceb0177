"""The wire: ZeroMQ sockets on the event loop, the envelope and msgpack codec, CURVE keys (docs/wire-format.md)."""

from .codec import PROTOCOL_VERSION, ProtocolError
from .errors import AskTimeout, MailboxError, MessageTooLarge, PeerDown, RemoteError, UnknownPeer
from .mailbox import Mailbox, MailboxConfig
from .security import JobKeys

__all__ = ["PROTOCOL_VERSION", "ProtocolError", "AskTimeout", "MailboxError", "MessageTooLarge", "PeerDown",
           "RemoteError", "UnknownPeer", "Mailbox", "MailboxConfig", "JobKeys"]
