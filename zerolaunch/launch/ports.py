"""Free TCP ports and rendezvous endpoints.

A single-node run binds port 0 on 127.0.0.1 and lets the OS choose, so two runs started at once never
collide on a hard-coded port; the port is released just before the elastic agent binds it (a short window,
the same one torchrun's --standalone has).
"""

from __future__ import annotations

import socket

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
