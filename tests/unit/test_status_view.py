"""zinfer status: the table render and the command loop (with a stand-in status source)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from zinfer.client.errors import ConnectionFailed, Unavailable
from zinfer.tools.status_view import main, render

STATUS: dict[str, Any] = {
    "server": {"pid": 4242, "uptime_s": 3723.4, "ready": True},
    "models": [
        {
            "name": "linear",
            "version": 1,
            "state": "UNAVAILABLE",
            "reason": "worker crashed 5 times in a minute",
            "queue_depth": 0,
            "mean_batch_1m": None,
            "p99_ms_1m": None,
            "rate_1m": 0.0,
            "instances": [],
        },
        {
            "name": "add",
            "version": 1,
            "state": "READY",
            "reason": None,
            "queue_depth": 3,
            "mean_batch_1m": 3.25,
            "p99_ms_1m": 1.234,
            "rate_1m": 1520.5,
            "instances": [
                {
                    "instance": 1,
                    "pid": 2346,
                    "device": "gpu:0",
                    "state": "LOADING",
                    "rss_bytes": 1288490188,
                    "cpu_s": 3.5,
                    "restarts": 1,
                },
                {
                    "instance": 0,
                    "pid": 2345,
                    "device": "cpu",
                    "state": "READY",
                    "rss_bytes": 125000000,
                    "cpu_s": 12.31,
                    "restarts": 0,
                    "busy_s": 75.25,
                },
            ],
        },
    ],
}

EXPECTED = """\
zinfer  pid 4242  up 1h02m03s  ready

MODEL   VER  STATE        QUEUE  BATCH/1m  P99 ms/1m  REQ/s 1m  REASON
add       1  READY            3      3.25       1.23    1520.5
linear    1  UNAVAILABLE      0         -          -       0.0  worker crashed 5 times in a minute

INSTANCE   PID  DEVICE  STATE          RSS  CPU s  RESTARTS  BUSY s
add/1/0   2345  cpu     READY    119.2 MiB   12.3         0    75.2
add/1/1   2346  gpu:0   LOADING    1.2 GiB    3.5         1       -
"""


def test_render_golden() -> None:
    assert render(STATUS) == EXPECTED


def test_render_tolerates_missing_and_odd_fields() -> None:
    text = render({})
    assert text == "zinfer  pid -  up -  ready: -\n\nno models\n"
    text = render(
        {
            "server": {"pid": 1, "uptime_s": 2 * 86400 + 5, "ready": False},
            "models": [{"name": "m", "queue_depth": "x", "instances": [{"rss_bytes": 512}]}],
        }
    )
    assert text.splitlines()[0] == "zinfer  pid 1  up 2d0h00m05s  not ready"
    lines = text.splitlines()
    assert lines[3].split() == ["m", "-", "-", "-", "-", "-", "-"]
    assert lines[6].split() == ["m/-/-", "-", "-", "-", "512", "B", "-", "-", "-"]


def test_long_reasons_are_cut() -> None:
    text = render({"models": [{"name": "m", "version": 1, "state": "UNAVAILABLE", "reason": "x" * 500}]})
    assert max(len(line) for line in text.splitlines()) < 200
    assert "x…" in text


class Source:
    def __init__(self, replies: list[dict[str, Any] | BaseException]) -> None:
        self.replies = replies
        self.closed = False

    def server_status(self) -> dict[str, Any]:
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def close(self) -> None:
        self.closed = True


def run(argv: list[str], source: Source) -> tuple[int, str, list[float], list[tuple[str | None, float]]]:
    out = io.StringIO()
    sleeps: list[float] = []
    calls: list[tuple[str | None, float]] = []

    def connect(url: str | None, timeout: float) -> Source:
        calls.append((url, timeout))
        return source

    code = main(argv, connect=connect, out=out, sleep=sleeps.append)
    return code, out.getvalue(), sleeps, calls


def test_main_draws_once() -> None:
    source = Source([STATUS])
    code, out, sleeps, calls = run(["--url", "ipc:///tmp/x.sock"], source)
    assert (code, out, sleeps) == (0, EXPECTED, [])
    assert calls == [("ipc:///tmp/x.sock", 5.0)]
    assert source.closed


def test_main_watch_redraws_count_times() -> None:
    source = Source([STATUS, STATUS, STATUS, STATUS])
    code, out, sleeps, _ = run(["--watch", "0.5", "--count", "3"], source)
    assert code == 0
    assert out.count("zinfer  pid 4242") == 3
    assert sleeps == [0.5, 0.5]
    assert len(source.replies) == 1


def test_main_watch_stops_on_ctrl_c() -> None:
    source = Source([STATUS, KeyboardInterrupt()])
    code, out, _, _ = run(["--watch", "1"], source)
    assert code == 0
    assert out.count("zinfer  pid") == 1
    assert source.closed


def test_main_server_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    source = Source([Unavailable("the server is shutting down")])
    code, out, _, _ = run([], source)
    assert (code, out) == (1, "")
    assert "shutting down" in capsys.readouterr().err
    assert source.closed


def test_main_connect_failure_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    def connect(url: str | None, timeout: float) -> Source:
        raise ConnectionFailed("no server at ipc:///nowhere")

    assert main(["--url", "ipc:///nowhere"], connect=connect, out=io.StringIO()) == 1
    assert "no server" in capsys.readouterr().err


def test_main_rejects_a_bad_watch_interval() -> None:
    assert run(["--watch", "0"], Source([]))[0] == 2


def test_on_demand_memory_line() -> None:
    memory = {"mode": "on-demand", "budget": {"host": 200 << 20},
              "resident": {"host": 150 << 20, "gpu0": 1 << 30},
              "loads": 7, "evictions": 3, "loading": ["scale_4"], "waiting_requests": 2}  # fmt: skip
    text = render({**STATUS, "memory": memory})
    line = text.splitlines()[1]
    assert line == (
        "on-demand  gpu0 1.0 GiB / no budget  host 150.0 MiB / 200.0 MiB  loads 7  evictions 3"
        "  loading scale_4  waiting 2"
    )
    assert render(STATUS).splitlines()[1] == ""  # no line without on-demand control
