"""A broker's default process id is one Gazette's clients accept."""

from __future__ import annotations

import pytest

from pygazette.broker import server
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_process_id


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("broker-7.example.com", "broker-7.example.com"),
        ("vm", "pygazette-vm"),  # Too short for a Gazette suffix (4 to 128 characters).
        ("host name!", "pygazette-host-name-"),
        ("h" * 200, "pygazette-" + "h" * 118),
    ],
)
def test_default_broker_id(monkeypatch: pytest.MonkeyPatch, host: str, expected: str) -> None:
    monkeypatch.setattr(server.socket, "gethostname", lambda: host)
    broker_id = server.default_broker_id()
    assert broker_id == expected
    validate_process_id(pb.ProcessSpec.ID(zone="local", suffix=broker_id))
