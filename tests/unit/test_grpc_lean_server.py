"""grpc_native.LeanServer answers a raw method's calls as pygrpc-native's own server does: the same bytes, the
same status and text for an abort, an unexpected error, a request or response over the limits, the same
trailing metadata and done callbacks, and cancellation of the handler when the client leaves. Both servers
run for real (pygrpc-native's Rust front on a local port) and a grpcio client calls each."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from zinfer.client.errors import ConfigError
from zinfer.frontdoor import grpc_native

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pygrpc_native") is None, reason="no pygrpc-native")

SERVICE = "test.Lean"
LIMIT = 1 << 16


class _Handlers:
    def __init__(self) -> None:
        self.done: list[str] = []
        self.cancelled = asyncio.Event()
        self.metadata: list[Any] = []

    async def raw(self, request: bytes, context: Any) -> bytes:
        self.metadata.append({k: v for k, v in context.invocation_metadata()})
        context.add_done_callback(lambda _c: self.done.append(request[:8].decode(errors="replace")))
        if request == b"abort":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad input 'x'")
        if request == b"raise":
            raise ValueError("boom")
        if request == b"code":
            context.set_code(grpc.StatusCode.NOT_FOUND)
            context.set_details("no such thing")
            return b""
        if request == b"trailing":
            context.set_trailing_metadata((("k", "v"),))
        if request == b"big":
            return b"z" * (LIMIT + 1)
        if request == b"wait":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if request == b"text":
            return "é"  # type: ignore[return-value] - grpc.aio encodes a str as UTF-8
        return b"echo:" + request


async def _server(lean: bool, handlers: _Handlers) -> tuple[Any, int]:
    options = [("grpc.max_receive_message_length", LIMIT), ("grpc.max_send_message_length", LIMIT)]
    if lean:
        server = grpc_native.lean_server(options, frozenset(("Raw",)), SERVICE)
    else:
        server = importlib.import_module("pygrpc_native.aio").server(options=options)
    method = grpc.unary_unary_rpc_method_handler(handlers.raw)
    server.add_registered_method_handlers(SERVICE, {"Raw": method})
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _answers(lean: bool) -> tuple[list[Any], _Handlers]:
    handlers = _Handlers()
    server, port = await _server(lean, handlers)
    assert type(server).__name__ == ("LeanServer" if lean else "Server")
    out: list[Any] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/Raw")
            for request in (b"hello", b"abort", b"raise", b"code", b"trailing", b"big", b"text",
                            b"x" * (LIMIT + 1)):  # fmt: skip
                c = call(request, metadata=(("traceparent", "00-abc"),), timeout=20)
                try:
                    out.append(("ok", await c, tuple(await c.trailing_metadata())))
                except grpc.aio.AioRpcError as e:
                    out.append((e.code(), e.details(), tuple(e.trailing_metadata() or ())))
            waiting = call(b"wait", timeout=20)
            await asyncio.sleep(0.3)
            waiting.cancel()
            await asyncio.wait_for(handlers.cancelled.wait(), 10)
        for _ in range(100):  # the last done callbacks run as the calls end
            if len(handlers.done) >= 7:
                break
            await asyncio.sleep(0.05)
    finally:
        await server.stop(None)
    return out, handlers


async def _both() -> None:
    stock, stock_handlers = await _answers(lean=False)
    lean, lean_handlers = await _answers(lean=True)
    assert lean == stock
    assert lean[0] == ("ok", b"echo:hello", ())
    assert lean[1][:2] == (grpc.StatusCode.INVALID_ARGUMENT, "bad input 'x'")
    assert lean[2][0] == grpc.StatusCode.UNKNOWN
    assert lean[3][:2] == (grpc.StatusCode.NOT_FOUND, "no such thing")
    assert lean[4] == ("ok", b"echo:trailing", (("k", "v"),))
    assert lean[5][0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert lean[6] == ("ok", "é".encode(), ())
    assert lean[7][0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert sorted(lean_handlers.done) == sorted(stock_handlers.done)
    assert "wait" in lean_handlers.done  # a cancelled call's callbacks run too
    assert lean_handlers.metadata == stock_handlers.metadata  # the same pairs, read the same way
    assert [m.get("traceparent") for m in lean_handlers.metadata] == ["00-abc"] * 7 + [None]


def test_a_raw_method_answers_as_pygrpc_native_answers() -> None:
    asyncio.run(_both())


async def _other_methods() -> None:
    """A method not named raw (and a stream) still goes pygrpc-native's own way on the lean server."""
    handlers = _Handlers()
    options: list[tuple[str, Any]] = []
    server = grpc_native.lean_server(options, frozenset(("Raw",)), SERVICE)

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for r in requests:
            yield b"s:" + r

    server.add_registered_method_handlers(
        SERVICE,
        {
            "Raw": grpc.unary_unary_rpc_method_handler(handlers.raw),
            "Other": grpc.unary_unary_rpc_method_handler(handlers.raw),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            raw = channel.unary_unary(f"/{SERVICE}/Raw")
            other = channel.unary_unary(f"/{SERVICE}/Other")
            calls = [
                raw(b"r%d" % i, timeout=20) if i % 2 else other(b"o%d" % i, timeout=20) for i in range(40)
            ]
            answers = await asyncio.gather(*calls)
            assert answers == [b"echo:" + (b"r%d" if i % 2 else b"o%d") % i for i in range(40)]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await other(b"abort", timeout=20)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            replies = [
                r async for r in channel.stream_stream(f"/{SERVICE}/Stream")(iter([b"a", b"b"]), timeout=20)
            ]
            assert replies == [b"s:a", b"s:b"]
    finally:
        await server.stop(None)


def test_other_methods_and_streams_go_pygrpc_natives_way() -> None:
    asyncio.run(_other_methods())


def test_the_io_threads_come_from_the_environment_and_a_bad_value_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(grpc_native.IO_THREADS_ENV, raising=False)
    assert grpc_native.io_threads() == grpc_native.IO_THREADS
    monkeypatch.setenv(grpc_native.IO_THREADS_ENV, " 3 ")
    assert grpc_native.io_threads() == 3
    server = grpc_native.lean_server([], frozenset(("Raw",)), SERVICE)
    assert server._io_threads == 3
    for bad in ("0", "65", "-1", "two", "1.5", "\u00b2"):
        monkeypatch.setenv(grpc_native.IO_THREADS_ENV, bad)
        with pytest.raises(ConfigError, match=grpc_native.IO_THREADS_ENV):
            grpc_native.io_threads()
