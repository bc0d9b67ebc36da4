"""The one loopback check (``client/addresses.py``) that the broker's TCP frontend, ``zinfer serve`` and the
front-door processes share."""

from __future__ import annotations

import pytest

from zinfer.client.addresses import is_loopback


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1:5555", True), ("127.1.2.3:1", True), ("[::1]:1", True), ("localhost:1", True),
     ("0.0.0.0:1", False), ("[::]:1", False), ("10.0.0.1:1", False), ("*:1", False), ("example.org:1", False),
     ("127.0.0.1", False), ("", False)],
)  # fmt: skip
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback
