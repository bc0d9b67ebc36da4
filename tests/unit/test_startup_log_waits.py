"""StartupLog's ready line waits for the named parts (the front doors) up to WAIT_LIMIT_S, then names those
still not up."""

from __future__ import annotations

import logging

import pytest

from zinfer.broker.startup_log import WAIT_LIMIT_S, StartupLog


def test_ready_waits_for_every_part(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zinfer.broker.server")
    up = {"doors": False}
    log = StartupLog(0.0)
    log.waits["frontdoors"] = lambda: up["doors"]
    assert log.ready(1.0, ["add:1"], []) is False
    assert log.ready(2.0, ["add:1"], []) is False
    assert "event=ready" not in caplog.text
    up["doors"] = True
    assert log.ready(2.5, ["add:1"], []) is True
    assert "event=ready models=add:1 failed=-" in caplog.text and "not_up" not in caplog.text


def test_a_part_never_up_is_named_after_the_limit(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zinfer.broker.server")
    log = StartupLog(0.0)
    log.waits["frontdoors"] = lambda: False
    assert log.ready(10.0, [], ["bad"]) is False
    assert log.ready(10.0 + WAIT_LIMIT_S - 0.01, [], ["bad"]) is False
    assert log.ready(10.0 + WAIT_LIMIT_S, [], ["bad"]) is True
    assert "event=ready models=- failed=bad" in caplog.text and "not_up=frontdoors" in caplog.text


def test_without_waits_ready_is_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zinfer.broker.server")
    assert StartupLog(0.0).ready(0.5, ["a:1", "b:2"], ["c", "c"]) is True
    assert "models=a:1,b:2 failed=c " in caplog.text
