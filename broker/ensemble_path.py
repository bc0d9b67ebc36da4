"""Ensembles on the request path: the broker runs each request's steps as their inputs come to exist.

A step's request is an ordinary request to the step's model, made by the broker: it joins that model's
own scheduler (``queues.Queues.enqueue``) beside the model's direct traffic, and its reply comes back to
the ensemble run instead of to a client (``Pending.on_done``).

Where the tensors live:

* the ensemble's inputs stay where the client put them (its region, or the request's inline frames);
* every tensor a later step reads (an intermediate) is written by its worker into a slot of the server's
  own shared memory (segments ``zinfer-s<pid>-...``, made and unlinked by the broker), and the next step's
  worker reads it from there: intermediates never pass through a socket. A slot is exact when the step's
  config fixes the output's size, a guess otherwise; a worker whose output outgrew its slot sends it
  inline, and the broker puts it into a slot of the right size before the next step reads it;
* an ensemble output no step reads goes where the client asked for it: the last step writes it there.

An error in any step fails the whole request with the step named (``in ensemble 'e' step 2 (model
'm'): ...``) and the status of the step's error; the steps still queued are withdrawn. The server's slots
of a request are freed once no step of it is queued or running.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from zinfer.client import protocol
from zinfer.client.arena import Slot
from zinfer.client.errors import (
    InternalError,
    ResourceExhausted,
    ServerError,
    Status,
    Unavailable,
    Unsupported,
)
from zinfer.client.protocol import Frame, InferRequest, OutputRequest, Reply, ShmRef, TensorRef
from zinfer.client.shm import Segment, new_server_name
from zinfer.client.worker_protocol import RequestResult

from .ensemble_plan import PlanStep, name_step
from .ensemble_run import Run, ServerRegions, ServerSlots, Value, output_row_bytes
from .model_state import ModelState, Pending
from .regions import RegionTable
from .validation import check_request

if TYPE_CHECKING:
    from .cache_path import CachePath
    from .completion import Completion
    from .queues import Queues
    from .registry import ModelRegistry
    from .tracing import Tracer

log = logging.getLogger(__name__)

# what reading a step's outputs may raise: the run fails with the step named, the broker goes on
_FILL_ERRORS = (ServerError, KeyError, TypeError, ValueError, IndexError)

INITIAL_SHM_BYTES = 16 << 20  # the server's first segment for intermediates; it grows as needed
MAX_SHM_BYTES = 4 << 30  # at most this much server shared memory for intermediates in all
MIN_GUESS_BYTES = 64 << 10  # a slot for an output of unknown size: at least this, or 4x the step's inputs


def _server_segment(size: int) -> Segment:
    """A named segment in /dev/shm for the server's own tensors (workers attach it by name)."""
    return Segment.create(size, new_server_name())


class EnsemblePath:
    def __init__(
        self,
        registry: ModelRegistry,
        client_regions: RegionTable,
        queues: Queues,
        completion: Completion,
        caching: CachePath,
        tracer: Tracer,
        max_tensor_bytes: int,
    ) -> None:
        self.registry = registry
        self.queues = queues  # a step's request joins its model's queue
        self.tracer, self.max_tensor_bytes = tracer, max_tensor_bytes  # an ensemble trace's children
        self.completion, self.caching = completion, caching  # the ensemble's own reply, and its cache
        self.slots = ServerSlots(INITIAL_SHM_BYTES, MAX_SHM_BYTES, _server_segment)
        self.regions = ServerRegions(client_regions, self.slots.segments)
        self.live: dict[int, Run] = {}  # runs not finished, by id (on-demand control keeps their models)

    # ------------------------------------------------------------------------------------ start

    def start(self, state: ModelState, p: Pending, now: float) -> None:
        """Begin an ensemble request: its inputs are known, the steps that need only them start."""
        plan = state.scheduler.plan
        assert plan is not None
        run = Run(state, p, plan)
        self.live[id(run)] = run
        for t in p.request.inputs:
            data = p.frames[t.frame] if t.frame is not None else None
            run.tensors[t.name] = Value(t.datatype, list(t.shape), t.shm, data)
        for o in p.outputs:
            if o.slot is not None:
                run.client_slots[o.name] = o.slot
        self._advance(run, now)

    def _advance(self, run: Run, now: float) -> None:
        """Start every step whose inputs now exist; finish the run when every step is done."""
        while not run.finished:
            ready = run.plan.runnable(run.tensors.keys(), run.started)
            if not ready:
                break
            have = len(run.tensors)
            for i in ready:
                if i in run.started:  # a step that answered at once (a cache hit) started it already
                    continue
                run.started.add(i)
                self._start_step(run, i, now)
                if run.finished:
                    return
            if len(run.tensors) == have:  # no step answered at once: no new tensor, nothing else to run
                break
        if not run.finished and len(run.done) == len(run.plan.steps):
            self._complete(run)

    def _start_step(self, run: Run, i: int, now: float) -> None:
        step = run.plan.steps[i]
        p = run.p
        try:
            target = self.registry.resolve(step.model, step.version)
            if not target.ready:
                reason = target.error or "no instance is ready yet"
                raise Unavailable(
                    f"Request for unknown model: '{target.name}' version {target.version} "
                    f"is not at ready state: {reason}"
                )
            if target.signature.decoupled:
                raise Unsupported(f"model '{target.name}' is decoupled: an ensemble step must answer once")
            frames: list[Frame] = []
            inputs = [self._input_ref(run, name, tensor, frames) for name, tensor in step.inputs]
            outputs = [self._output_ref(run, target, step, o, t, inputs, frames) for o, t in step.outputs]
            r = p.request
            # built here, not decoded from a header: every part is the broker's own or was checked
            # when the ensemble's request came in; check_request holds it against the step's model
            req = InferRequest(r.request_id, target.name, target.version, tuple(inputs), tuple(outputs),
                               r.priority, r.timeout_us, r.parameters, r.caller_id)  # fmt: skip
            checked = check_request(req, frames, target.signature, self.regions, p.client,
                                    self.max_tensor_bytes)  # fmt: skip
            sp = Pending(next(self.queues.seqs), p.client, req, frames, checked.outputs, checked.batch_size,
                         now, input_bytes=checked.input_bytes)  # fmt: skip
            if p.trace is not None:  # the ensemble's trace: its steps' are its children
                sp.trace = self.tracer.child(p.trace, target.name, target.version,
                                             request=req, frames=frames)  # fmt: skip
            sp.on_done = lambda reply, out_frames: self._step_done(run, i, reply, out_frames)
            sp.on_outputs = lambda res, out_frames: self._step_outputs(run, i, res, out_frames)
            run.outstanding[i] = (target, sp)
            try:
                if not self.queues.enqueue(target, sp, checked.shape_key, now):
                    self.start(target, sp, now)  # a nested ensemble: its own steps start
            except BaseException as refused:  # (one name per handler: see scheduler.Batching.add)
                run.outstanding.pop(i, None)
                if sp.trace is not None:  # the step was refused: its trace ends here
                    self.tracer.refused(sp.trace, getattr(refused, "status", Status.INTERNAL))
                raise
        except ServerError as error:
            self._fail(run, step, error.status, error.wire_text())
        except Exception as bug:  # a plan or config the checks missed: fail the request, not the broker
            log.exception("event=ensemble_step_failed ensemble=%s step=%d", run.state.name, step.index)
            self._fail(run, step, Status.INTERNAL, f"InternalError: {type(bug).__name__}: {bug}")

    def _input_ref(self, run: Run, model_input: str, tensor: str, frames: list[Frame]) -> TensorRef:
        v = run.tensors[tensor]
        if v.shm is not None:
            return TensorRef(model_input, v.datatype, tuple(v.shape), v.shm)
        assert v.data is not None
        frames.append(v.data)
        return TensorRef(model_input, v.datatype, tuple(v.shape), None, len(frames) - 1)

    def _output_ref(
        self,
        run: Run,
        target: ModelState,
        step: PlanStep,
        model_output: str,
        tensor: str,
        inputs: list[TensorRef],
        frames: list[Frame],
    ) -> OutputRequest:
        """Where a step writes one output: a server slot for an intermediate, else where the client said."""
        if not run.plan.is_intermediate(tensor):
            return OutputRequest(model_output, run.client_slots.get(tensor))
        row, batching = output_row_bytes(target.signature, model_output)
        if row >= 0:
            rows = int(inputs[0].shape[0]) if batching and inputs and inputs[0].shape else 1
            nbytes = rows * row
        else:
            nbytes = max(MIN_GUESS_BYTES, 4 * sum(self._nbytes(t, frames) for t in inputs))
        slot = self._alloc(run, nbytes)
        return OutputRequest(model_output, ShmRef(slot.region, slot.offset, slot.nbytes))

    @staticmethod
    def _nbytes(t: TensorRef, frames: list[Frame]) -> int:
        if t.shm is not None:
            return t.shm.nbytes
        assert t.frame is not None
        return len(memoryview(frames[t.frame]).cast("B"))

    def _alloc(self, run: Run, nbytes: int) -> Slot:
        try:
            slot = self.slots.alloc(nbytes)
        except (ResourceExhausted, OSError) as exc:
            raise ResourceExhausted(f"no server shared memory for an ensemble tensor: {exc}") from None
        run.slots.append(slot)
        return slot

    # ------------------------------------------------------------------------------------ step replies

    # Step ``i`` of a run ended (``_step_done``, ``_step_outputs``): its outputs become the run's tensors
    # (``PlanStep.tensor_of``), or the run fails (the step's error, or what reading its outputs finds
    # wrong); then the steps they feed start (``_settled``).

    def _step_done(self, run: Run, i: int, reply: Reply, frames: list[Frame]) -> None:
        """A step's reply (``Pending.on_done``): an error, or outputs as a client would get them."""
        step = self._ended(run, i)
        if step is None:
            return
        if reply.status != Status.OK:
            self._fail(run, step, reply.status, reply.error)
            return
        try:
            body = reply.body if isinstance(reply.body, dict) else {}
            for o in body.get("outputs", []):
                tensor = step.tensor_of(str(o["name"]))
                if tensor is not None:
                    run.tensors[tensor] = self._keep(run, tensor, o, frames)
        except _FILL_ERRORS as exc:
            self._fill_failed(run, step, exc)
            return
        self._settled(run, i, step)

    def _step_outputs(self, run: Run, i: int, res: RequestResult, frames: list[Frame]) -> None:
        """A step's success as its worker sent it (``Pending.on_outputs``): no client reply built and read
        back, as ``_step_done`` does for the replies that need one (ordering, the cache, errors)."""
        step = self._ended(run, i)
        if step is None:
            return
        try:
            for t in res.outputs:
                tensor = step.tensor_of(t.name)
                if tensor is None:
                    continue
                if t.shm is not None:
                    run.tensors[tensor] = Value(t.datatype, list(t.shape), t.shm)
                elif t.frame is not None and 0 <= t.frame < len(frames):
                    v = Value(t.datatype, list(t.shape))
                    run.tensors[tensor] = self._inline(run, tensor, v, frames[t.frame])
                else:
                    raise InternalError(f"the step's output {t.name!r} names no frame of its result")
        except _FILL_ERRORS as exc:
            self._fill_failed(run, step, exc)
            return
        self._settled(run, i, step)

    def _ended(self, run: Run, i: int) -> PlanStep | None:
        """Step ``i`` is no longer outstanding; the step, or None when its run already ended."""
        run.outstanding.pop(i, None)
        if run.finished:
            self._release(run)
            return None
        return run.plan.steps[i]

    def _fill_failed(self, run: Run, step: PlanStep, exc: Exception) -> None:
        if isinstance(exc, ServerError):
            self._fail(run, step, exc.status, exc.wire_text())
        else:
            self._fail(run, step, Status.INTERNAL, f"InternalError: malformed step result ({exc})")

    def _settled(self, run: Run, i: int, step: PlanStep) -> None:
        """The step's outputs are the run's tensors: check they are all there, then start what they feed."""
        tensors = run.tensors
        for _, t in step.outputs:
            if t not in tensors:
                missing = ", ".join(repr(m) for _, m in step.outputs if m not in tensors)
                text = f"InternalError: the step returned no tensor {missing}"
                self._fail(run, step, Status.INTERNAL, text)
                return
        run.done.add(i)
        self._advance(run, time.monotonic())

    def _keep(self, run: Run, tensor: str, o: dict[str, Any], frames: list[Frame]) -> Value:
        """A step's output as a value of the run; an intermediate that came inline goes into a slot."""
        v = Value(str(o["datatype"]), [int(x) for x in o["shape"]])
        if "shm" in o:
            v.shm = protocol.shm_from_wire(o["shm"])
            return v
        return self._inline(run, tensor, v, frames[int(o["frame"])])

    def _inline(self, run: Run, tensor: str, v: Value, data: Frame) -> Value:
        """An output that came inline: kept as it is, or, for an intermediate, moved into a server slot."""
        if not run.plan.is_intermediate(tensor):
            v.data = data
            return v
        raw = memoryview(data).cast("B")
        slot = self._alloc(run, len(raw))
        slot.view()[: len(raw)] = raw
        v.shm = ShmRef(slot.region, slot.offset, len(raw))
        log.info("event=intermediate_moved_to_server_memory ensemble=%s tensor=%s bytes=%d",
                 run.plan.name, tensor, len(raw))  # fmt: skip
        return v

    # ------------------------------------------------------------------------------------ the end

    def _complete(self, run: Run) -> None:
        """Every step is done: the ensemble's outputs to the client, the figures to the ensemble's stats."""
        state, p = run.state, run.p
        outs: list[dict[str, Any]] = []
        frames: list[Frame] = []
        for o in p.outputs:
            name = o.name
            v = run.tensors[name]
            d: dict[str, Any] = {"name": name, "datatype": v.datatype, "shape": v.shape}
            if v.shm is not None and v.shm == run.client_slots.get(name):
                d["shm"] = protocol.shm_to_wire(v.shm)
            else:
                frames.append(v.data if v.data is not None else self._read(v.shm))
                d["frame"] = len(frames) - 1
            outs.append(d)
        now_ns = time.monotonic_ns()
        duration = now_ns - int(p.arrival * 1e9)
        if p.cache_key is not None and self.caching.cache is not None:
            # copied before the reply: once answered, the client may reuse its output slots
            self.caching.store(state, p.cache_key, outs, frames)
        run.finished = True  # (``outs`` numbers ``frames`` from 0 already, as the client reads them)
        body = {"model": state.name, "version": state.version, "outputs": outs}
        self.completion.reply(state, p, Reply(p.request.request_id, Status.OK, body=body), frames)
        state.stats.record_success(duration)  # counted once the reply has left
        state.stats.inference_count += p.batch_size
        state.stats.execution_count += 1
        state.stats.last_inference_ms = int(time.time() * 1000)
        state.metrics.success(duration / 1000, 0.0, p.batch_size)
        state.window.record(now_ns / 1e9, duration / 1e9)
        self._release(run)

    def _read(self, shm: ShmRef | None) -> bytes:
        """The bytes of a tensor in a region: a server slot, or (an input passed through) a client's."""
        assert shm is not None
        region, offset, nbytes = shm
        seg = self.slots.segments.get(region)
        if seg is not None:
            return bytes(seg.buf[offset : offset + nbytes])
        copied = self.caching.readers.copy(ShmRef(region, offset, nbytes))
        if copied is None:
            raise InternalError("an ensemble input region could not be read")
        return copied

    def _fail(self, run: Run, step: PlanStep, status: Status, error: str) -> None:
        """A step failed: the request fails with the step named; its steps still queued are withdrawn."""
        if run.finished:
            return
        run.finished = True
        state, p = run.state, run.p
        for i, (target, sp) in list(run.outstanding.items()):
            removed = target.scheduler.remove(lambda q, sp=sp: q is sp)  # type: ignore[misc]
            if removed:
                run.outstanding.pop(i, None)
                if target.order is not None:
                    for _, (q, ready, ready_frames) in target.order.drop(sp.seq):
                        self.completion.deliver(q, ready, ready_frames)
        duration = time.monotonic_ns() - int(p.arrival * 1e9)
        state.stats.fail.add(duration)
        if status == Status.CANCELLED:
            state.metrics.cancelled()
        else:
            state.metrics.failure("BACKEND")
        text = name_step(run.plan.name, step, error)
        log.info("event=ensemble_failed ensemble=%s step=%d model=%s", run.plan.name, step.index, step.model)
        self.completion.reply(state, p, Reply(p.request.request_id, status, text), [])
        self._release(run)

    def _release(self, run: Run) -> None:
        """Free the run's server slots once none of its steps can still touch them."""
        if run.outstanding:
            return
        self.live.pop(id(run), None)
        for slot in run.slots:
            self.slots.free(slot)
        run.slots.clear()

    def models_in_use(self) -> set[str]:
        """The ensembles with a request in progress and every model their steps run."""
        out: set[str] = set()
        for run in self.live.values():
            out.add(run.state.name)
            out.update(step.model for step in run.plan.steps)
        return out

    def close(self) -> None:
        """Unlink the server's segments (at shutdown, after every request was answered)."""
        self.slots.close()

