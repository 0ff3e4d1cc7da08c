"""Free TCP ports and rendezvous endpoints.

A single-node run binds port 0 on 127.0.0.1 and lets the OS choose, so two runs started at once never
collide on a hard-coded port; the port is released just before the elastic agent binds it (a short window,
the same one torchrun's --standalone has).

A given endpoint on this machine is checked before any worker starts (`check_endpoint`): when another
program holds its port, torch's agent falls back to being a client of that program and waits on it forever.
"""

from __future__ import annotations

import errno
import socket
import threading
from datetime import timedelta

from zerolaunch.config.errors import UserError

LOOPBACK = "127.0.0.1"


class LaunchError(UserError):
    """A launch flag or machine state that prevents starting the run; the message names the fix."""


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """ "host:port" -> (host, port), or a LaunchError saying what is wrong with it."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(
            f"--rdzv-endpoint {endpoint!r} is not host:port; give e.g. --rdzv-endpoint 10.0.0.1:29500 "
            "(the same on every node, the address of node 0)"
        )
    return host.strip("[]"), int(port)


STORE_ANSWER_SECONDS = 10.0
"""How long a held endpoint port gets to answer as a rendezvous store before the launch is refused."""


def _is_local(host: str) -> bool:
    """True when `host` names an address of this machine (only those can be bound)."""
    try:
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            s.bind((host, 0))
    except OSError:
        return False
    return True


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _port_held(host: str, port: int) -> bool:
    """True when binding host:port fails because something holds it (as torch's store would bind it)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def _answers_as_store(host: str, port: int, wait_s: float) -> bool:
    """True when a torch TCPStore answers at host:port within `wait_s`.

    A TCPStore client does not time out against a listener that never replies, so it runs on a daemon
    thread that is given up on after `wait_s` (the launch then ends with a LaunchError)."""
    answered = threading.Event()

    def connect() -> None:
        from torch.distributed import TCPStore

        try:
            TCPStore(host, port, is_master=False, timeout=timedelta(seconds=wait_s))
        except Exception:
            return
        answered.set()

    threading.Thread(target=connect, name="zerolaunch-endpoint-probe", daemon=True).start()
    return answered.wait(wait_s)


def check_endpoint(host: str, port: int, *, must_host: bool, wait_s: float = STORE_ANSWER_SECONDS) -> None:
    """Refuse a rendezvous endpoint on this machine whose port another program holds.

    must_host: this launcher is the one that hosts the rendezvous store (one node, or static node rank 0),
    so any holder of the port is another program. Otherwise (c10d over several nodes, some on this machine)
    the holder may be the launcher of another node: it is let through when it answers as a store.
    An endpoint on another machine is not checked here: its node may simply not have started yet."""
    if not _is_local(host) or not _port_held(host, port):
        return
    if not must_host and _answers_as_store(host, port, wait_s):
        return
    how = "" if must_host else f" and does not answer as a rendezvous store within {wait_s:g} s"
    raise LaunchError(
        f"rendezvous endpoint {host}:{port} is held by another program (its port is in use{how}), so the "
        f"workers would wait on it forever. Give another port (--rdzv-endpoint {host}:OTHER_PORT; on one node, "
        f"leave --rdzv-endpoint out to get a free one), or stop the program holding port {port} "
        f"(`ss -ltnp 'sport = :{port}'` shows which)."
    )
