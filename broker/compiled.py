"""Which modules a wheel compiles with mypyc, and which of them run compiled in this process.

``setup.py`` reads ``COMPILED`` (this file imports nothing of zinfer, so the build can run it alone); the
broker logs ``compiled_here()`` when it starts, and the benchmarks record it beside their figures. The list
names client modules too (the wheel compiles them for every installed client), but only the broker reads it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util

__all__ = ["COMPILED", "compiled_here"]

# On the path of every request in the client, the broker, the worker or all. Not here: modules with async
# generators (async_client, async_stream: mypyc has none), the worker's model-facing modules (pb_utils
# and its pb_* parts: their objects are weakly referenced, which compiled classes refuse; model.py: models
# subclass its classes), model_loop (asyncio runs its coroutines), and the decoupled and GPU paths.
# The worker's Triton path (triton_model, pb_*) stays interpreted: an earlier all-worker build (main loop,
# request path and triton_model together) lost on the three-step ensemble at c1 in one compiled run (2903 vs
# 2453 CPU us per request, workers 1452 vs 1250); its compiled code called the interpreted pb_* classes.
# triton_model alone, on top of the main loop compiled, did not win either (ab_turns text_ensemble:32, 6
# rounds in turns, load 13-23: workers 1.17x; ab_worker_loop tokenizer:8:4 1.08x; results in
# bench/results/worker-compile/), though warm in process it is no slower (``_result`` 175 -> 149 ns): a
# quieter machine may say otherwise.
# Compiled: ``workers.batch``, the plain batch path (built-in kernels, ONNX): no pb_* class on it. add0, one
# EXECUTE in process: 10.4-11.4 -> 8.7-9.5 us in ``run_batch``; the worker alone behind a ROUTER
# (bench/ab_worker_loop.py add0:1:1, 5 rounds in turns): 59.8 -> 55.5 us of worker CPU per request.
# And ``workers.batch_io``, the pieces it calls (input arrays, output checks, emits, results): one add0
# EXECUTE in process, run_batch 8.3-9.0 -> 7.5 us; the three-step ensemble (whose Triton-style steps use it
# too) does not lose: ab_turns text_ensemble:32, 4 rounds in turns, total CPU 274 -> 267 us per request.
COMPILED = (
    "zinfer.client.protocol",
    "zinfer.client.framing",
    "zinfer.client.transport",
    "zinfer.client.base",
    "zinfer.client.connection",
    "zinfer.client.async_connection",
    "zinfer.client.server_check",
    "zinfer.client.trace_context",  # with_trace_context: once per request, sync and async clients
    "zinfer.client.link_watch",  # LinkWatch.poll: once per request (ab_turns add0:1, 5 rounds: client 0.97x)
    "zinfer.client.call_waiter",
    # an AsyncConnection's timeouts: ``Deadlines.add`` once per request of the front door and AsyncClient
    # (interpreted, about 2 % of the HTTP door's main thread at c32 in py-spy)
    "zinfer.client.deadlines",
    "zinfer.client.client",
    "zinfer.client.result",
    "zinfer.client.worker_protocol",
    "zinfer.broker.server",
    "zinfer.broker.drain",
    "zinfer.broker.dispatcher",
    "zinfer.broker.validation",
    "zinfer.broker.outbox",
    "zinfer.broker.worker_inbox",
    "zinfer.broker.completion",
    "zinfer.broker.messages",
    "zinfer.broker.admission",
    "zinfer.broker.instance_pool",
    "zinfer.broker.model_metrics",
    "zinfer.broker.model_state",
    "zinfer.broker.pending",
    "zinfer.broker.scheduler",
    "zinfer.broker.sequence_scheduler",
    "zinfer.broker.queues",
    "zinfer.broker.batching.runs",
    "zinfer.broker.ensemble_path",
    "zinfer.broker.ensemble_plan",
    "zinfer.broker.ensemble_run",
    "zinfer.broker.registry",
    "zinfer.broker.latency_window",
    # the worker's plain batch path (gather, run, scatter: built-in kernels, ONNX) and its pieces, see above
    "zinfer.workers.batch",
    "zinfer.workers.batch_io",
    # the worker's main loop and its request-by-request path (worker, socket calls, regions, cancel flags,
    # side work, runners, request_batch; not triton_model/pb_*): compiled builds in turns, 5 rounds
    # (bench/ab_turns.py add0:1,text_ensemble:32): workers' CPU per request add0 c1 112.8 -> 90.7 us,
    # ensemble c32 152.0 -> 124.1 us (lower in every round); the worker alone (ab_worker_loop, best
    # windows): add0 42.2 -> 37.8 us, tokenizer 59.5 -> 52.7 us
    "zinfer.workers.worker",
    "zinfer.workers.worker_socket",
    "zinfer.workers.regions",
    "zinfer.workers.cancel_flags",
    "zinfer.workers.side_work",
    "zinfer.workers.runners",
    "zinfer.workers.request_batch",
    # the built-in kernels (add0's own execute) and their bases; with BatchOutcome a plain class (a compiled
    # dataclass keeps the interpreted __init__ dataclasses writes: 470 ns per EXECUTE): the worker alone,
    # ab_worker_loop add0:1:1, 6 rounds in turns against the build before, best windows lower in each
    # round (median 45.3 -> 39.0 us), median of the rounds' ratios 0.77
    "zinfer.workers.kernel_base",
    "zinfer.workers.kernels",
    "zinfer.workers.dense",
    # asked per request whether the connection reads its replies (``Outbox.backlog_full``, 1.1 % of the
    # compiled broker at add c32 in perf, interpreted)
    "zinfer.broker.reply_backlog",
    # the loop's wait (interpreted, the largest share of the compiled broker's Python at c1: perf,
    # bench/profile_perf.py) and the batcher's rate estimates (each request is observed)
    "zinfer.broker.precise_wait",
    "zinfer.broker.batching.early_dispatch",
    "zinfer.broker.batching.adaptive",
    # the dynamic batcher: its per-request records are native classes, not generic (a generic dataclass
    # fails at import), with their own __init__ that checks what a native field would convert (a bool
    # to an int) or refuse with a TypeError; BatchPolicy, built per model load, is an ordinary class
    "zinfer.broker.batching.batch_policy",
    "zinfer.broker.batching.priority_queue",
    "zinfer.broker.batching.batcher",
    # the front door's request path (not bridge, door_client, grpc_service: an async generator, and classes
    # of interpreted bases whose methods tests replace)
    "zinfer.frontdoor.bridge_records",
    "zinfer.frontdoor.errors",
    "zinfer.frontdoor.classification",
    "zinfer.frontdoor.grpc_convert",
    "zinfer.frontdoor.grpc_request",
    "zinfer.frontdoor.grpc_response",
    "zinfer.frontdoor.http_codec",
    "zinfer.frontdoor.http_reply",
    "zinfer.frontdoor.http_views",
    "zinfer.frontdoor.http_known",
    "zinfer.frontdoor.http_messages",
    "zinfer.frontdoor.http_wire",
    "zinfer.frontdoor.http_server",
    # the HTTP door's direct path (a request of a kept header as its body's byte ranges, a reply of a kept
    # kind as its frames): its records and the code around the call to the broker
    "zinfer.frontdoor.http_raw",
    "zinfer.frontdoor.http_direct",
)


def compiled_here() -> list[str]:
    """The modules of ``COMPILED`` that import from an extension module (a ``.so``) here, not a ``.py``."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    for name in COMPILED:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and spec.origin.endswith(suffixes):
            out.append(name)
    return out
