"""A front door that does nothing: the cost of a Python gRPC or HTTP server stack by itself.

``python bench/frontdoor_replay.py KIND UPSTREAM PORT`` listens on 127.0.0.1:PORT and answers every call with
the bytes a real KServe v2 server at UPSTREAM gave for it: the first call of each kind (and every
statistics call) is passed through and its answer recorded; after that an infer is answered from the
record without decoding it or reaching the broker. One infer in ``FORWARD_EVERY`` is also passed through
in the background, so perf_analyzer's server statistics keep moving (it refuses a model whose counts stand
still). What perf_analyzer measures against this is the ceiling of the server library: no front door
built on it can go faster.

KIND is one of ``grpc-aio`` (grpcio's asyncio server, as zinfer's door), ``grpc-aio-uvloop`` (the same on
uvloop's event loop), ``grpc-native-aio`` (pygrpc-native's grpc.aio-compatible server, its HTTP/2 in
Rust), ``grpc-h2corn`` and ``h2corn`` (h2corn's Rust HTTP/2 and HTTP/1.1 server under an ASGI
application), ``grpc-sync-N`` (grpcio's thread-pool server with N threads), ``aiohttp`` (aiohttp's
low-level server, as zinfer's door), ``httptools`` (an asyncio protocol around the httptools parser;
keep-alive HTTP/1.1 only, enough for perf_analyzer). Prints ``ready`` once listening; runs until killed.
"""

from __future__ import annotations

import asyncio
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

FORWARD_EVERY = 50
KEEP = ("content-type", "inference-header-content-length")


class _Count:
    n = 0

    def forward_now(self) -> bool:
        self.n += 1
        return self.n % FORWARD_EVERY == 0


def _record_key(method: str, body: bytes, infer: bool) -> tuple[str, bytes]:
    return (method, b"") if infer else (method, body)


def grpc_aio(upstream: str, port: int) -> None:
    import grpc

    async def main() -> None:
        channel = grpc.aio.insecure_channel(upstream)
        record: dict[tuple[str, bytes], bytes] = {}
        count = _Count()

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: Any) -> Any:
                method = details.method
                if method.endswith("ModelStreamInfer"):
                    return None
                infer = method.endswith("/ModelInfer")

                async def answer(request: bytes, context: Any) -> bytes:
                    key = _record_key(method, request, infer)
                    reply = record.get(key)
                    if reply is None or not infer:
                        reply = record[key] = await channel.unary_unary(method)(request)
                    elif count.forward_now():
                        asyncio.ensure_future(channel.unary_unary(method)(request))
                    return reply

                return grpc.unary_unary_rpc_method_handler(answer)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((Handler(),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def grpc_native_aio(upstream: str, port: int) -> None:
    """pygrpc-native's grpc.aio-compatible server (HTTP/2 and gRPC framing in Rust, outside the GIL): the
    infer method registered by name, as grpcio-tools' generated code registers it (a generic handler would
    go to its grpcio fallback server)."""
    import grpc
    import pygrpc_native.aio

    async def main() -> None:
        channel = grpc.aio.insecure_channel(upstream)
        record: dict[tuple[str, bytes], bytes] = {}
        count = _Count()
        service = "inference.GRPCInferenceService"

        def handler(name: str) -> Any:
            method = f"/{service}/{name}"
            infer = name == "ModelInfer"

            async def answer(request: bytes, context: Any) -> bytes:
                key = _record_key(method, request, infer)
                reply = record.get(key)
                if reply is None or not infer:
                    reply = record[key] = await channel.unary_unary(method)(request)
                elif count.forward_now():
                    asyncio.ensure_future(channel.unary_unary(method)(request))
                return reply

            return grpc.unary_unary_rpc_method_handler(answer)

        names = ("ModelInfer", "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                 "ModelConfig", "ModelStatistics", "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
                 "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus")  # fmt: skip
        server = pygrpc_native.aio.server()
        server.add_registered_method_handlers(service, {n: handler(n) for n in names})
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def h2corn_server(upstream: str, port: int, grpc_mode: bool) -> None:
    """h2corn (HTTP/1.1 and h2c in Rust, an ASGI application in Python): for gRPC, each recorded reply framed
    as gRPC frames it (a flag byte, a 4-byte length) with ``grpc-status: 0`` in the trailers."""
    import h2corn

    channel: Any = None
    record: dict[tuple[str, str, bytes], tuple[int, list[tuple[bytes, bytes]], bytes]] = {}
    count = _Count()

    async def forward(method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        if grpc_mode:
            message = await channel.unary_unary(path)(body[5:])
            return 200, [(b"content-type", b"application/grpc")], message
        loop = asyncio.get_running_loop()
        status, got, reply = await loop.run_in_executor(None, _fetch, upstream, method, path, headers, body)
        return status, [(k.lower().encode(), v.encode()) for k, v in got.items()], reply

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            event = await receive()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        body, method, path = b"".join(chunks), scope["method"], scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"] if k.decode().lower() in KEEP}
        infer = path.endswith(("/infer", "/ModelInfer"))
        key = (method, path, b"" if infer else body)
        hit = record.get(key)
        if hit is None or path.endswith(("/stats", "/ModelStatistics")):
            hit = record[key] = await forward(method, path, headers, body)
        elif infer and count.forward_now():
            asyncio.ensure_future(forward(method, path, headers, body))
        status, reply_headers, reply = hit
        if grpc_mode:
            framed = b"\x00" + len(reply).to_bytes(4, "big") + reply
            start = {"type": "http.response.start", "status": 200, "headers": reply_headers, "trailers": True}
            await send(start)
            await send({"type": "http.response.body", "body": framed})
            await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]})
            return
        reply_headers = [*reply_headers, (b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": reply_headers})
        await send({"type": "http.response.body", "body": reply})

    async def main() -> None:
        nonlocal channel
        if grpc_mode:
            import grpc

            channel = grpc.aio.insecure_channel(upstream)
        server = h2corn.Server(app, h2corn.Config(bind=(f"127.0.0.1:{port}",), access_log=False))
        task = asyncio.ensure_future(server.serve())
        await server.wait_started()
        print("ready", flush=True)
        await task

    asyncio.run(main())


def grpc_sync(upstream: str, port: int, threads: int) -> None:
    import grpc

    channel = grpc.insecure_channel(upstream)
    record: dict[tuple[str, bytes], bytes] = {}
    count = _Count()

    class Handler(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            method = details.method
            if method.endswith("ModelStreamInfer"):
                return None
            infer = method.endswith("/ModelInfer")

            def answer(request: bytes, context: Any) -> bytes:
                key = _record_key(method, request, infer)
                reply = record.get(key)
                if reply is None or not infer:
                    reply = record[key] = channel.unary_unary(method)(request)
                elif count.forward_now():
                    channel.unary_unary(method).future(request)
                return reply

            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.server(ThreadPoolExecutor(max_workers=threads))
    server.add_generic_rpc_handlers((Handler(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def _fetch(
    upstream: str, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    data = body if method == "POST" else None
    request = urllib.request.Request(f"http://{upstream}{path}", data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as f:
        return f.status, {k: v for k, v in f.headers.items() if k.lower() in KEEP}, f.read()


def aiohttp_server(upstream: str, port: int) -> None:
    from aiohttp import web

    record: dict[tuple[str, str, bytes], tuple[int, dict[str, str], bytes]] = {}
    count = _Count()

    async def handler(request: web.BaseRequest) -> web.Response:
        body = await request.read()
        infer = request.path.endswith("/infer")
        key = (request.method, request.path, b"" if infer else body)
        headers = {k: v for k, v in request.headers.items() if k.lower() in KEEP}
        hit = record.get(key)
        loop = asyncio.get_running_loop()
        if hit is None or request.path.endswith("/stats"):
            hit = record[key] = await loop.run_in_executor(
                None, _fetch, upstream, request.method, request.path, headers, body
            )
        elif infer and count.forward_now():
            loop.run_in_executor(None, _fetch, upstream, request.method, request.path, headers, body)
        status, reply_headers, reply = hit
        return web.Response(status=status, body=reply, headers=reply_headers)

    async def main() -> None:
        runner = web.ServerRunner(web.Server(handler))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def httptools_server(upstream: str, port: int) -> None:
    import httptools

    record: dict[tuple[str, str, bytes], bytes] = {}
    count = _Count()

    def render(status: int, headers: dict[str, str], body: bytes) -> bytes:
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return f"HTTP/1.1 {status} OK\r\n{lines}Content-Length: {len(body)}\r\n\r\n".encode() + body

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.url, self.headers, self.body = "", {}, []  # type: ignore[var-annotated]

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url.decode()

        def on_header(self, name: bytes, value: bytes) -> None:
            if name.decode().lower() in KEEP:
                self.headers[name.decode().lower()] = value.decode()

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, headers, self.body, self.headers = b"".join(self.body), self.headers, [], {}
            method, path = self.parser.get_method().decode(), self.url
            infer = path.endswith("/infer")
            key = (method, path, b"" if infer else body)
            hit = record.get(key)
            if hit is None or path.endswith("/stats"):  # a blocking pass-through: only the first calls
                hit = record[key] = render(*_fetch(upstream, method, path, headers, body))
            elif infer and count.forward_now():
                asyncio.get_running_loop().run_in_executor(
                    None, _fetch, upstream, method, path, headers, body
                )
            self.transport.write(hit)

    async def main() -> None:
        await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def main(argv: list[str]) -> None:
    kind, upstream, port = argv[0], argv[1], int(argv[2])
    if kind.endswith("-uvloop"):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        kind = kind.removesuffix("-uvloop")
    if kind == "grpc-aio":
        grpc_aio(upstream, port)
    elif kind == "grpc-native-aio":
        grpc_native_aio(upstream, port)
    elif kind in ("grpc-h2corn", "h2corn"):
        h2corn_server(upstream, port, kind == "grpc-h2corn")
    elif kind.startswith("grpc-sync-"):
        grpc_sync(upstream, port, int(kind.removeprefix("grpc-sync-")))
    elif kind == "aiohttp":
        aiohttp_server(upstream, port)
    elif kind == "httptools":
        httptools_server(upstream, port)
    else:
        raise SystemExit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
