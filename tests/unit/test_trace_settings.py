"""Trace settings: Triton's ``--trace-config`` syntax, the trace extension's updates, the JSON file writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zinfer.broker.trace_file import TraceFile
from zinfer.broker.trace_settings import TraceSettings, parse_trace_config, update
from zinfer.broker.tracing import Tracer, parse_traceparent


def test_triton_example_flags_parse() -> None:
    s = parse_trace_config(["triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100",
                            "level=TIMESTAMPS", "count=100"])  # fmt: skip
    assert s == TraceSettings(
        level=("TIMESTAMPS",), rate=100, count=100, file="/tmp/t.json", log_frequency=50
    )
    assert s.enabled
    assert s.to_wire() == {"trace_file": "/tmp/t.json", "trace_level": ["TIMESTAMPS"], "trace_rate": "100",
                           "trace_count": "100", "log_frequency": "50", "trace_mode": "triton"}  # fmt: skip


def test_defaults_are_tritons_and_off() -> None:
    s = parse_trace_config([])
    assert (s.level, s.rate, s.count, s.mode, s.log_frequency) == (("OFF",), 1000, -1, "triton", 0)
    assert not s.enabled
    assert not Tracer(s).on


def test_level_repeats_add_levels() -> None:
    assert parse_trace_config(["level=TIMESTAMPS", "level=TENSORS"]).level == ("TIMESTAMPS", "TENSORS")


@pytest.mark.parametrize(
    "arg, words",
    [
        ("rate=0", "at least 1"),
        ("rate=x", "integer"),
        ("count=-2", "at least -1"),
        ("level=LOUD", "OFF, TIMESTAMPS, TENSORS"),
        ("mode=jaeger", "triton or opentelemetry"),
        ("triton,colour=red", "unknown setting"),
        ("zipkin,url=x", "unknown mode"),
        ("rate", "SETTING=VALUE"),
        ("bogus=1", "unknown global setting"),
    ],
)
def test_bad_flags_say_why(arg: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_trace_config([arg])


def test_update_checks_everything_before_changing() -> None:
    base = TraceSettings(level=("TIMESTAMPS",), rate=5, file="/x")
    assert update(base, {"trace_rate": "2", "trace_level": ["OFF"]}) == TraceSettings(rate=2, file="/x")
    bads: list[dict[str, object]] = [{"trace_rate": "0"}, {"trace_level": "LOUD"}, {"nope": "1"},
                                     {"trace_rate": ["1", "2"]}, {"trace_file": "/etc/passwd"},
                                     {"trace_mode": "opentelemetry"}, {"trace_count": 3}]  # fmt: skip
    for bad in bads:
        with pytest.raises(ValueError):
            update(base, bad)


def test_tracer_rate_count_and_model_settings() -> None:
    t = Tracer(TraceSettings(level=("TIMESTAMPS",), rate=3, count=2))
    picked = [t.start("m", 1, str(i), {}, 1) is not None for i in range(12)]
    assert picked == [False, False, True, False, False, True] + [False] * 6
    assert t.get(None)["trace_count"] == "0" and t.on  # two traces still open
    t._open = 0
    t._refresh()
    assert not t.on
    t.set("m", {"trace_count": "-1", "trace_rate": "1"})
    assert t.on and t.get("m")["trace_rate"] == "1" and t.get(None)["trace_rate"] == "3"
    assert t.start("m", 1, "x", {}, 1) is not None and t.start("other", 1, "y", {}, 1) is None
    with pytest.raises(ValueError):
        t.set("m", {"trace_rate": "-1"})
    assert t.get("m")["trace_rate"] == "1"  # a rejected update changed nothing
    t._open = 0  # the trace of "x" is not finished here
    t.set("m", {})  # a model's own settings removed: the global ones apply again
    assert t.get("m")["trace_rate"] == "3" and not t.on


def test_traceparent_parsing() -> None:
    tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    assert parse_traceparent(f"00-{tid}-{sid}-01") == (tid, sid)
    assert parse_traceparent(f"00-{tid.upper()}-{sid}-00") == (tid, sid)
    for bad in (f"ff-{tid}-{sid}-01", f"00-{'0' * 32}-{sid}-01", f"00-{tid}-{'0' * 16}-01", "00-xyz", 7,
                f"00-{tid}-{sid}-01-extra"):  # fmt: skip
        assert parse_traceparent(bad) is None


def test_trace_file_log_frequency(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    f = TraceFile(str(path))
    for i in range(5):
        f.add([{"id": i}], 2)
    assert json.loads((tmp_path / "trace.json.0").read_text()) == [{"id": 0}, {"id": 1}]
    assert json.loads((tmp_path / "trace.json.1").read_text()) == [{"id": 2}, {"id": 3}]
    assert not path.exists()
    f.close()
    assert json.loads((tmp_path / "trace.json.2").read_text()) == [{"id": 4}]
    g = TraceFile(str(tmp_path / "all.json"))
    g.add([{"id": 1}], 0)
    assert not (tmp_path / "all.json").exists()
    g.close()
    assert json.loads((tmp_path / "all.json").read_text()) == [{"id": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.json", "trace.json.0", "trace.json.1",
                                                           "trace.json.2"]  # fmt: skip
