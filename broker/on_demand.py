"""On-demand model control (``zinfer serve --model-control-mode on-demand``): a model loads when its first
request arrives and is unloaded when a memory budget would be exceeded or after an idle time.

A request for a model that is not loaded (or an ensemble any of whose steps is not) is parked here, and the
loads it needs start (one per model, however many requests race for it); when they finish, the parked
requests go through admission as if they had just arrived; when one fails, or the request's timeout passes
first, they are answered with the reason. Before a load, ``residency.plan_room`` picks the least recently
used models to unload so that the measured footprints plus the new model's estimate stay within
``--memory-budget``; a model with queued or running requests, live sequences, a running ensemble that needs
it or parked requests waiting for it is never picked, nor a pinned one (parameter ``zinfer_pinned``). When
nothing can be unloaded, the parked requests fail at once with ResourceExhausted naming the budget.

Footprints are measured, not declared: each instance's worker RSS (psutil) for ``host`` and, for GPU
instances, the device memory its heartbeats report for ``gpuN``; a model not measured yet is estimated by
its last measurement, else the mean instance."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zinfer.client import protocol
from zinfer.client.errors import Cancelled, DeadlineExceeded, ResourceExhausted, ServerError, Unavailable
from zinfer.client.protocol import Command, InferRequest, Reply

from .footprint_probe import FootprintProbe
from .memory_budget import HOST, MemoryBudget, format_bytes
from .model_control import LOAD_TIMEOUT_S, ModelControl
from .model_needs import config_of, devices_of, pinned, unloaded_info
from .model_needs import needs as model_needs
from .model_state import ModelState
from .residency import Footprint, Resident, estimate, idle, over_budget, plan_room, total
from .residency_metrics import ResidencyMetrics

if TYPE_CHECKING:
    from .instance_pool import InstancePool
    from .outbox import Outbox
    from .registry import ModelRegistry
    from .server import Broker
    from .supervisor import Supervisor

log = logging.getLogger(__name__)

__all__ = ["OnDemand"]

MEASURE_INTERVAL_S = 0.5
RETRY_INTERVAL_S = 0.02  # a load waiting for memory being freed looks again this often


@dataclass
class Parked:
    identity: bytes
    message: protocol.Message
    request_id: str
    needs: frozenset[str]
    deadline: float


class OnDemand:
    def __init__(
        self,
        budget: MemoryBudget,
        idle_unload_s: float | None,
        registry: ModelRegistry,
        pool: InstancePool,
        control: ModelControl,
        supervisor: Supervisor,
        outbox: Outbox,
        replay: Callable[[bytes, protocol.Message], None],
        ensembles_in_use: Callable[[], set[str]],
        device_bytes: dict[bytes, int],
        base_index: Callable[[], list[dict[str, Any]]],
        base_status: Callable[[], dict[str, Any]],
        base_cancel: Callable[[bytes, str], str],
        draining: Callable[[], bool] = lambda: False,
    ) -> None:
        self.budget = budget
        self.idle_unload_s = idle_unload_s
        self.registry = registry
        self.pool = pool
        self.control = control
        self.supervisor = supervisor
        self.outbox = outbox
        self.draining = draining  # the server drains: admission refuses new requests, none is parked
        self.replay = replay  # a parked request goes through admission (``Broker._on_client_message``)
        self.ensembles_in_use = ensembles_in_use  # models a running ensemble request needs
        self.probe = FootprintProbe(pool, supervisor, device_bytes)
        self.repository = control.options.model_repository
        self.metrics = ResidencyMetrics(dict(budget.limits))
        self.base_index = base_index  # the repository index to annotate (``ModelControl.index``)
        self.base_status = base_status  # the status answer to annotate (``Observer.status``)
        self.base_cancel = base_cancel  # a CANCEL of a request not parked here (``Admission.cancel``)
        self.parked: list[Parked] = []
        self.wanted: list[str] = []  # models to load, waiting for room, in the order they were asked for
        self.asked: dict[str, float] = {}  # wanted model -> when its first waiting request came
        self.loading: dict[str, float] = {}  # model -> when its first waiting request came
        self.last_used: dict[str, float] = {}
        self.footprints: dict[str, dict[str, int]] = {}  # loaded models, as last measured
        self.measured: dict[str, dict[str, int]] = {}  # every model measured once, for the next estimate
        self.evicted: dict[str, str] = {}  # unloaded models and why, for the repository index
        self.failed: dict[str, str] = {}  # models whose last load failed, and why
        self.loads = 0
        self.evictions = 0
        self._next_measure = 0.0
        self._next_retry = 0.0
        self._freeing: dict[str, int] = {}

    @classmethod
    def of(cls, broker: Broker) -> OnDemand:
        """On-demand control of ``broker``'s models; registers its metrics, wraps the broker's views."""
        o = broker.options
        on_demand = cls(
            o.memory_budget, o.model_idle_unload_s, broker.registry, broker.pool, broker.control,
            broker.supervisor, broker.outbox, broker._on_client_message, broker.ensembles.models_in_use,
            broker.worker_inbox.device_bytes, broker.control.index, broker.observer.status,
            broker.admission.cancel, lambda: broker.draining_since is not None,
        )  # fmt: skip
        broker.observer.metrics.registry.register(on_demand.metrics)
        return on_demand

    # ------------------------------------------------------------------------------------ requests

    def park(self, identity: bytes, message: protocol.Message, now: float) -> bool:
        """Park an INFER whose model (or one of its ensemble's steps) is not loaded, and start its loads;
        False when everything it needs is loaded (admission takes it now) or it names no model of the
        repository (admission answers it)."""
        head = message.record_or_header  # an INFER read straight from its bytes, or its header map
        typed = isinstance(head, InferRequest)
        name = head.model if typed else head.get("model")
        if not isinstance(name, str) or not name or self.draining():
            return False
        needs = model_needs(self.registry, self.repository, name)
        if needs is None:
            return False
        missing = [n for n in sorted(needs) if not self._ready(n)]
        if not missing:
            for n in needs:
                self.last_used[n] = now
            return False
        timeout_us = head.timeout_us if typed else head.get("timeout_us", 0)
        wait_s = timeout_us / 1e6 if isinstance(timeout_us, int) and timeout_us > 0 else LOAD_TIMEOUT_S
        rid = protocol.request_id_of(head)
        self.parked.append(Parked(identity, message, rid, frozenset(needs), now + wait_s))
        for n in missing:
            if n not in self.wanted and n not in self.loading:
                self.wanted.append(n)
                self.asked[n] = now
        try:
            self._start_loads(now)
        except Exception:  # parked already: never answered twice; the loop's poll tries again
            log.exception("event=on_demand_start_failed model=%s", name)
        return True

    def model_info(self, command: Command, header: dict[str, Any]) -> Any:
        """Metadata or config of a model not loaded yet (``model_needs.unloaded_info``); None otherwise."""
        return unloaded_info(self.registry, self.repository, command, header)

    def _ready(self, name: str) -> bool:
        versions = self.registry.models.get(name)
        return bool(versions) and any(s.ready for s in versions.values())  # type: ignore[union-attr]

    # ------------------------------------------------------------------------------------ the loop

    def poll(self, now: float) -> None:
        """Each turn of the broker loop: finished loads, parked requests, measurements, evictions."""
        if not (self.parked or self.wanted or self.loading) and now < self._next_measure:
            return
        try:
            self._poll(now)
        except Exception:  # a bug here must never take the broker loop down: logged, tried next turn
            log.exception("event=on_demand_poll_failed")

    def _poll(self, now: float) -> None:
        loaded = self._finished_loads(now)
        if loaded or now >= self._next_measure:
            self._next_measure = now + MEASURE_INTERVAL_S
            self.measure(now)
            self._enforce(now, frozenset(loaded))
        if self.parked:
            self._release_parked(now)
        if self.wanted and now >= self._next_retry:
            self._next_retry = now + RETRY_INTERVAL_S
            self._start_loads(now)

    def _finished_loads(self, now: float) -> list[str]:
        pending = {p.name for p in self.control.pending}
        done: list[str] = []
        for name, started in list(self.loading.items()):
            if name in pending:
                continue
            del self.loading[name]
            if self._ready(name):
                seconds = now - started
                self.loads += 1
                self.metrics.loaded(name, True, seconds)
                self.last_used[name] = now
                self.evicted.pop(name, None)
                self.failed.pop(name, None)
                done.append(name)
                log.info("event=model_loaded_on_demand model=%s cold_start_s=%.3f", name, seconds)
            else:
                error = self._failed(name) or self.registry.reload_errors.get(name) or "not ready"
                self.metrics.loaded(name, False)
                self._fail(name, Unavailable(f"model '{name}' failed to load: {error}"))
        return done

    def _failed(self, name: str) -> str | None:
        """A failed load's reason, kept here rather than among the registry's load errors: a model that
        failed to load on demand does not make the server unready (it is tried again on its next request)."""
        error = self.registry.load_errors.pop(name, None)
        if error is not None:
            self.failed[name] = error
        return error

    def _release_parked(self, now: float) -> None:
        keep: list[Parked] = []
        ready: list[Parked] = []
        for p in self.parked:
            if all(self._ready(n) for n in p.needs):
                ready.append(p)
            elif now >= p.deadline:
                names = ", ".join(sorted(n for n in p.needs if not self._ready(n)))
                self._answer(p, DeadlineExceeded(f"Request timeout expired while loading model(s) {names}"))
            else:
                keep.append(p)
        self.parked = keep
        for p in ready:
            self.replay(p.identity, p.message)

    def _start_loads(self, now: float) -> None:
        """Start the wanted loads there is room for, unloading LRU models first; fail those that cannot
        fit; leave those that wait for memory being freed."""
        if self.budget:
            self._freeing = self.probe.states(self.registry.retiring)
        for name in list(self.wanted):
            if self._ready(name):  # loaded meanwhile (an explicit load)
                self.wanted.remove(name)
                self.asked.pop(name, None)
                continue
            if any(p.name == name for p in self.control.pending):  # loading already (an explicit load)
                self.wanted.remove(name)
                self.loading[name] = self.asked.pop(name, now)
                continue
            if self.budget:
                need = self._estimate(name)
                loading = total(self._estimate(n) for n in self.loading)
                plan = plan_room(self.budget, self.residents(), need, loading, self._freeing)
                if not plan.fits:
                    self.wanted.remove(name)
                    self.asked.pop(name, None)
                    log.warning("event=model_load_refused model=%s reason=%r", name, plan.short)
                    self._fail(name, ResourceExhausted(f"model '{name}' cannot be loaded: {plan.short}"))
                    continue
                for victim in plan.victims:
                    self.evict(victim, "budget", now)
                if plan.wait:
                    self._freeing = self.probe.states(self.registry.retiring)
                    continue
            self.wanted.remove(name)
            try:
                self.control.load(name, now)
            except ServerError as exc:
                self._failed(name)
                self.asked.pop(name, None)
                self.metrics.loaded(name, False)
                self._fail(name, exc)
                continue
            self.loading[name] = self.asked.pop(name, now)
            log.info("event=model_load_on_demand model=%s estimate=%s", name,
                     _describe(self._estimate(name)))  # fmt: skip

    def _enforce(self, now: float, just_loaded: frozenset[str]) -> None:
        """After a measurement: unload LRU models while a budget is exceeded; unload idle ones."""
        if self.budget:
            loading = total(self._estimate(n) for n in self.loading)
            for victim in over_budget(self.budget, self.residents(), loading, keep=just_loaded):
                self.evict(victim, "budget", now)
        if self.idle_unload_s is not None:
            for victim in idle(self.residents(), now, self.idle_unload_s):
                self.evict(victim, "idle", now)

    def evict(self, name: str, reason: str, now: float) -> None:
        footprint = self.footprints.pop(name, {})
        if not self.registry.remove(name):
            return
        self.evictions += 1
        self.metrics.evicted(name, reason)
        self.evicted[name] = reason
        for memory, n in footprint.items():
            self._freeing[memory] = self._freeing.get(memory, 0) + n
        idle_s = now - self.last_used.get(name, now)
        log.info("event=model_evicted model=%s reason=%s resident=%s idle_s=%.1f", name, reason,
                 _describe(footprint), idle_s)  # fmt: skip

    # ------------------------------------------------------------------------------------ residents

    def residents(self) -> list[Resident]:
        ensembles = self.ensembles_in_use()
        parked = {n for p in self.parked for n in p.needs}
        out: list[Resident] = []
        for name, versions in self.registry.models.items():
            states = list(versions.values())
            in_use = name in ensembles or name in parked or any(self._busy(s) for s in states)
            out.append(Resident(name, self.footprints.get(name, {}), self.last_used.get(name, 0.0), in_use,
                                any(pinned(s.config) for s in states)))  # fmt: skip
        return out

    def _busy(self, state: ModelState) -> bool:
        return bool(state.queued) or self.pool.busy(state) or state.scheduler.active() > 0

    def _estimate(self, name: str) -> dict[str, int]:
        devices = devices_of(config_of(self.registry, self.repository, name))
        return estimate(devices, self.measured.get(name), self.probe.per_instance)

    # ------------------------------------------------------------------------------------ measuring

    def measure(self, now: float) -> None:
        """Each loaded model's footprint now (``footprint_probe``)."""
        for name in self.registry.models:
            self.last_used.setdefault(name, now)  # loaded otherwise (at start, or on request): used now
        self.footprints = self.probe.models((n, v.values()) for n, v in self.registry.models.items())
        self.measured.update((n, fp) for n, fp in self.footprints.items() if fp)
        self.metrics.measured(self.footprints)

    # ------------------------------------------------------------------------------------ answers

    def _fail(self, name: str, error: ServerError) -> None:
        """Answer every parked request that needs ``name`` with ``error``."""
        keep: list[Parked] = []
        for p in self.parked:
            if name in p.needs:
                self._answer(p, error)
            else:
                keep.append(p)
        self.parked = keep

    def _answer(self, p: Parked, error: ServerError) -> None:
        self.outbox.send_client(p.identity, Reply(p.request_id, error.status, error.wire_text()))

    def cancel(self, identity: bytes, target: str) -> str:
        """CANCEL: a request waiting for a load is answered ``Cancelled`` ("queued"); others as admission
        cancels them."""
        for p in self.parked:
            if p.identity == identity and p.request_id == target:
                self.parked.remove(p)
                self._answer(p, Cancelled("the request was cancelled"))
                return "queued"
        return self.base_cancel(identity, target)

    def fail_all(self, error: ServerError) -> None:
        """The server stops: every parked request is answered."""
        for p in self.parked:
            self._answer(p, error)
        self.parked = []
        self.wanted = []
        self.asked = {}

    # ------------------------------------------------------------------------------------ visible

    def index(self) -> list[dict[str, Any]]:
        """The repository index with each model's resident bytes, and why an unloaded one is not loaded."""
        rows = self.base_index()
        for row in rows:
            name = row["name"]
            fp = self.footprints.get(name, {})
            row["resident_bytes"] = fp.get(HOST, 0)
            row["device_bytes"] = {m: n for m, n in fp.items() if m != HOST}
            if row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded":
                reason = self.evicted.get(name)
                row["reason"] = f"evicted ({reason}); loads on its next request" if reason else "not loaded"
                if name in self.failed:
                    row["reason"] = f"failed to load: {self.failed[name]}; tried again on its next request"
            elif name in self.loading or name in self.wanted:
                row["state"], row["reason"] = "LOADING", "on demand"
        return rows

    def status(self) -> dict[str, Any]:
        """``zinfer status``: the budget, the memory in use, loads and evictions, each model's footprint."""
        answer = self.base_status()
        for model in answer.get("models", []):
            fp = self.footprints.get(model["name"], {})
            model["resident_bytes"] = fp.get(HOST, 0)
            model["device_bytes"] = {m: n for m, n in fp.items() if m != HOST}
        answer["memory"] = {
            "mode": "on-demand",
            "budget": dict(self.budget.limits),
            "resident": total(self.footprints.values()),
            "loads": self.loads,
            "evictions": self.evictions,
            "loading": sorted(self.loading),
            "waiting_requests": len(self.parked),
            "idle_unload_s": self.idle_unload_s,
        }
        return answer


def _describe(fp: Footprint) -> str:
    return ",".join(f"{m}:{format_bytes(n).replace(' ', '')}" for m, n in sorted(fp.items())) or "-"
