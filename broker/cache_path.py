"""The response cache on the request path: a key from the request's bytes, hits answered at admission,
successful results copied in before their reply goes out.

Each lookup is timed into the model's statistics (``cache_hit`` / ``cache_miss``) and its metrics
(``nv_cache_*_per_model``): a hit counts its lookup time, a miss its lookup time plus, once its result is
stored, the time the copy into the cache took."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from zinfer.client.protocol import Frame, InferRequest, ShmRef
from zinfer.client.shm import Segment

from .metrics import CacheFigures
from .model_state import ModelState, Pending
from .response_cache import CachedResponse, CachedTensor, InputBytes, RegionReader, ResponseCache, request_key

log = logging.getLogger(__name__)


class CachePath:
    def __init__(
        self, cache_bytes: int, open_client: Callable[[str], Segment | None] = lambda name: None
    ) -> None:
        """``open_client``: a client region mapped read-only, by name (``RegionTable.map_readonly``)."""
        self.cache: ResponseCache | None = ResponseCache(cache_bytes) if cache_bytes > 0 else None
        self.readers = RegionReader()  # client regions mapped read-only, for the keys and the copies
        self.readers.open_client = open_client
        self._warned: set[str] = set()

    def lookup(self, state: ModelState, p: Pending) -> tuple[list[dict[str, Any]], list[Frame], int] | None:
        """The cached outputs of ``p`` (wire form, frames, lookup ns), or None; a miss marks ``p`` to be
        stored when it succeeds."""
        cache = self.cache
        if cache is None:
            if state.name not in self._warned:
                self._warned.add(state.name)
                log.warning("event=response_cache_off model=%s reason='the server has no cache'", state.name)
            return None
        t0 = time.perf_counter_ns()
        key = self._request_key(state, p.request, p.frames, [o.name for o in p.outputs])
        if key is None:  # an input could not be read (a shrunk region): the worker reports it
            return None
        hit = cache.get(key)
        if hit is None:
            p.cache_key = key
            miss_ns = time.perf_counter_ns() - t0
            state.stats.cache_miss.add(miss_ns)
            state.metrics.cache_miss(miss_ns / 1000)
            return None
        wire: list[dict[str, Any]] = []
        frames: list[Frame] = []
        for t in hit.outputs:
            wire.append(
                {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "frame": len(frames)}
            )
            frames.append(t.data)
        lookup_ns = time.perf_counter_ns() - t0
        state.stats.cache_hit.add(lookup_ns)
        state.metrics.cache_hit(lookup_ns / 1000)
        return wire, frames, lookup_ns

    def _request_key(
        self, state: ModelState, req: InferRequest, frames: list[Frame], outputs: list[str]
    ) -> bytes | None:
        inputs: list[InputBytes] = []
        views: list[memoryview] = []
        try:
            for t in req.inputs:
                if t.shm is not None:
                    view = self.readers.read(t.shm)
                    if view is None:
                        return None
                    views.append(view)
                    inputs.append((t.name, t.datatype, t.shape, view))
                elif t.frame is not None:
                    inputs.append((t.name, t.datatype, t.shape, frames[t.frame]))
            return request_key(state.name, state.version, state.generation, inputs, outputs)
        finally:
            for view in views:
                view.release()

    def store(
        self, state: ModelState, key: bytes, outputs: list[dict[str, Any]], frames: list[Frame]
    ) -> None:
        """Copy a successful result's outputs (inline frames, or the client's output slots) into the cache;
        a result it cannot read whole is not stored."""
        assert self.cache is not None
        t0 = time.perf_counter_ns()
        try:
            response = self._copy_outputs(outputs, frames)
        except (KeyError, TypeError, ValueError):
            response = None
        if response is not None:
            self.cache.put(key, response)
        insert_ns = time.perf_counter_ns() - t0
        state.stats.cache_miss.ns += insert_ns
        state.metrics.cache_insert(insert_ns / 1000)

    def figures(self) -> CacheFigures | None:
        """The cache's size, use and evictions for the metrics (None without a cache)."""
        c = self.cache
        return None if c is None else CacheFigures(c.used_bytes, c.capacity, len(c), c.evictions)

    def enabled_for(self, state: ModelState) -> bool:
        """Whether requests to ``state`` go through the cache (its config asks and the server has one)."""
        return self.cache is not None and state.config.response_cache.enable

    def _copy_outputs(self, outputs: list[dict[str, Any]], frames: list[Frame]) -> CachedResponse | None:
        tensors = []
        for t in outputs:
            if "frame" in t:
                idx = int(t["frame"])
                if not 0 <= idx < len(frames):
                    return None
                data = bytes(frames[idx])
            elif "shm" in t:
                region, offset, nbytes = t["shm"]
                copied = self.readers.copy(ShmRef(str(region), int(offset), int(nbytes)))
                if copied is None:
                    return None
                data = copied
            else:
                return None
            shape = tuple(int(d) for d in t["shape"])
            tensors.append(CachedTensor(str(t["name"]), str(t["datatype"]), shape, data))
        return CachedResponse(tuple(tensors))
