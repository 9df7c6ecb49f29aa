"""The wait for the master's port before the store's client connects."""

from __future__ import annotations

import socket
import time

import pytest

from hpcdist.distributed import group


def test_the_probe_resets_its_connection_instead_of_closing_it() -> None:
    # Closed the ordinary way (FIN), the probes held torch's store about 5 s before it
    # served the ranks' own connections; a reset leaves it nothing to wait for.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        group._wait_for_master("127.0.0.1", port, time.monotonic() + 30)
        probe, _ = listener.accept()
        with probe, pytest.raises(ConnectionResetError):
            probe.settimeout(30)
            probe.recv(1)


def test_a_port_nobody_listens_on_ends_in_a_timeout_naming_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with pytest.raises(TimeoutError, match=f"nothing accepted a connection at 127.0.0.1:{port}"):
        group._wait_for_master("127.0.0.1", port, time.monotonic() + 0.3)


def test_the_pauses_between_probes_start_short_and_double_to_a_quarter_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rank 0 listens within milliseconds of the start: a first pause of 5 ms, not 0.25 s,
    # is what every other rank pays at every start; a late master is still not hammered.
    pauses: list[float] = []

    class Enough(Exception):
        pass

    def sleep(seconds: float) -> None:
        pauses.append(round(seconds, 6))
        if len(pauses) == 8:
            raise Enough

    monkeypatch.setattr(group.time, "sleep", sleep)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with pytest.raises(Enough):
        group._wait_for_master("127.0.0.1", port, time.monotonic() + 30)
    assert pauses == [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.25]
