from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from sshpeer import SshPeer, start_sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshPeer]:
    """One real sshd per module: starting it costs key generation and a process."""
    peer = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield peer
    finally:
        peer.stop()


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A port whose listener completes the TCP handshake (the kernel does, from the
    backlog) and then never says a word: a hung sshd."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.fixture(scope="module")
def other_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshPeer]:
    """A second server with its own host key: the same host after a reinstall."""
    peer = start_sshd(tmp_path_factory.mktemp("sshd-other"))
    try:
        yield peer
    finally:
        peer.stop()
