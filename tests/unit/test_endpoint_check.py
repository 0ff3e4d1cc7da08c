"""A rendezvous endpoint on this machine whose port another program holds is refused before any worker
starts (launch/ports.py `check_endpoint`): at once when this launcher must host the store, after a short
wait when the holder might be another node's launcher but does not answer as a store. A free port, a real
store, and an endpoint on another machine pass.

Leaves out: the CLI wiring (tests/e2e/test_hangs_orphans.py).
"""

import datetime
import socket
import time

import pytest
import torch.distributed as dist

from zerolaunch.launch.ports import LaunchError, check_endpoint, free_port


@pytest.fixture
def held_port():
    """A port another program listens on (accepting, never answering)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        yield s.getsockname()[1]


def test_a_held_port_is_refused_at_once_naming_the_endpoint_and_the_fix(held_port):
    started = time.monotonic()
    with pytest.raises(LaunchError) as err:
        check_endpoint("127.0.0.1", held_port, must_host=True)
    assert time.monotonic() - started < 5
    message = err.value.message
    assert err.value.exit_code == 2
    assert f"rendezvous endpoint 127.0.0.1:{held_port} is held by another program" in message
    assert "OTHER_PORT" in message and f"port {held_port}" in message


def test_a_held_port_that_is_not_a_store_is_refused_after_the_wait(held_port):
    started = time.monotonic()
    with pytest.raises(LaunchError, match="does not answer as a rendezvous store within 1 s"):
        check_endpoint("127.0.0.1", held_port, must_host=False, wait_s=1.0)
    assert time.monotonic() - started < 10


def test_a_free_port_a_real_store_and_another_machine_pass():
    check_endpoint("127.0.0.1", free_port(), must_host=True)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )
    check_endpoint("127.0.0.1", store.port, must_host=False, wait_s=10.0)  # another node's launcher
    check_endpoint("192.0.2.1", 29500, must_host=True)  # TEST-NET-1: never this machine's address
