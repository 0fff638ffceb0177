"""Where the sockets torch.distributed opens for a job listen: on one host the loopback, on several the address the
job's topology names -- never every interface.

    store = tcp_store(addr, port, world_size, is_master=True, timeout=t)   # the store's server listens on addr only
    limit_collectives(addr)               # gloo and NCCL in this process listen on addr's interface
    env = collective_env(addr)            # the same, as environment for a process to start (an engine)

torch's TCPStore server listens on every address (`[::]:PORT`, dual-stack) whatever host it is given: the host
names only where clients connect (torch 2.13, TCPStoreLibUvBackend). It takes an already listening socket instead
(`master_listen_fd`), which is how the address is chosen here. Gloo's devices listen on the address of the host
name unless GLOO_SOCKET_IFNAME names an interface, NCCL's bootstrap on the first non-loopback interface unless
NCCL_SOCKET_IFNAME does; both are set (when the user has not set them) to the interface that holds the address.
The store is an unauthenticated key-value store (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping

from ..log import get_logger

log = get_logger(component="listen")

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
COLLECTIVE_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def is_loopback(addr: str) -> bool:
    if addr in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False


def listening_socket(addr: str, port: int = 0, backlog: int = 512) -> socket.socket:
    """A TCP socket listening on `addr:port` only (port 0: a free one)."""
    host = "127.0.0.1" if addr == "localhost" else addr.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def tcp_store(host: str, port: int, world_size: int | None, is_master: bool, **kw):
    """torch.distributed.TCPStore; its server (is_master) listens on `host:port` alone. `kw`: TCPStore's (timeout,
    wait_for_workers, multi_tenant)."""
    import torch.distributed as dist
    if not is_master:
        return dist.TCPStore(host, int(port), world_size, False, **kw)
    sock = listening_socket(host, port)
    bound = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the socket from here
    try:
        return dist.TCPStore(host, bound, world_size, True, master_listen_fd=fd, **kw)
    except BaseException:
        os.close(fd)
        raise


def interface_of(addr: str) -> str | None:
    """The name of this host's network interface holding `addr` (Linux); None where it cannot be told."""
    host = "127.0.0.1" if addr == "localhost" else addr.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(host))
        except OSError:
            return None
    if ip.version == 6:
        try:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6 and ipaddress.ip_address(int(parts[0], 16)) == ip:
                        return parts[5]
        except OSError:
            return None
        return None
    import fcntl
    import struct
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == str(ip):
                return name
    return None


def collective_env(addr: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for gloo and NCCL to listen on `addr`'s interface, less those the
    environment (`environ`, default os.environ) sets already; {} when the interface is unknown."""
    environ = os.environ if environ is None else environ
    iface = interface_of(addr)
    if iface is None:
        return {}
    want = {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": f"={iface}"}  # (NCCL: '=' = this name exactly)
    return {k: v for k, v in want.items() if k not in environ}


def limit_collectives(addr: str) -> dict[str, str]:
    """Set collective_env(addr) in this process (before its first gloo / NCCL group); returns what it set."""
    env = collective_env(addr)
    os.environ.update(env)
    if env:
        log.debug("collectives listen on one interface", address=addr, **env)
    return env


def address_towards(peer: str, port: int = 9) -> str:
    """This host's address on the interface that reaches `peer` (the loopback for a loopback peer; no packet is
    sent)."""
    if is_loopback(peer):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in peer.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer.strip("[]"), port))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


__all__ = ["tcp_store", "listening_socket", "limit_collectives", "collective_env", "interface_of", "address_towards",
           "is_loopback"]
