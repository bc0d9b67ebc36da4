"""A Triton-style ``TritonPythonModel`` behind the :class:`RequestModel` interface.

The worker hands ``execute`` one ``pb_utils.InferenceRequest`` per client request (each with its own
slice of the batch; nothing is concatenated) and expects one ``pb_utils.InferenceResponse`` per request,
in order. A request of a sequence carries its control inputs (START, END, READY, CORRID as the config names
them) among its input tensors, and its ``correlation_id()`` and ``flags()`` as in Triton. A response that
carries an error fails that request alone, with the error's message and a status from its code; an
exception raised by ``execute`` fails the whole batch, and so does a wrong number of responses.

``execute`` runs on the worker's model thread, or, when it is ``async def``, on the worker's event loop
(``zinfer.workers.model_loop``), while the worker's main thread reads the socket for cancellations.
A decoupled model (``model_transaction_policy { decoupled: true }``) answers through response senders
instead; ``zinfer.workers.triton_stream`` runs it.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

from zinfer.client.errors import InternalError, ServerError
from zinfer.modelconfig.model_config import ModelConfig

from . import triton_python_backend_utils as pb
from .batch_io import model_failure
from .cancel_flags import CancelFlag
from .device import Device
from .model import RequestInputs, RequestModel, RequestOutputs, RequestResult
from .model_loop import ModelThreads, Wake
from .pb_errors import server_error

log = logging.getLogger(__name__)


def instance_name(config: ModelConfig, instance: int, gpus: int = 1) -> str:
    """Triton's name for instance number ``instance``: ``<group name>_<index in its group>``, an unnamed
    group being ``<model>_<group index>``. Instances are numbered group by group, as the broker places
    them (``count`` per listed GPU; ``gpus`` GPUs for a GPU group that lists none)."""
    first = 0
    for group in config.instance_group:
        per_device = max(group.count, 1)
        devices = 1 if group.kind in ("KIND_CPU", "KIND_MODEL") else (len(group.gpus) or gpus)
        size = per_device * max(devices, 1)
        if instance < first + size:
            return f"{group.name}_{(instance - first) % per_device}"
        first += size
    return f"{config.name}_0_{instance}"


def initialize_args(config: ModelConfig, version_dir: Path, device: Device, instance: int) -> dict[str, str]:
    """The ``args`` of ``TritonPythonModel.initialize``, as Triton passes them (every value a string)."""
    return {
        "model_config": json.dumps(config.to_dict()),
        "model_instance_kind": device.kind,
        "model_instance_name": instance_name(config, instance),
        "model_instance_device_id": str(device.id),
        "model_repository": str(version_dir.parent),
        "model_version": version_dir.name,
        "model_name": config.name,
    }


def response_error(error: Any) -> ServerError:
    """The status and message a ``TritonError`` (or anything else given as an error) becomes."""
    return server_error(error)


def sequence_fields(sequence: Mapping[str, Any] | None) -> dict[str, Any]:
    """``correlation_id`` and ``flags`` of a sequence request, as Triton sets them (none otherwise)."""
    if sequence is None:
        return {}
    flags = pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if sequence.get("start") else 0
    if sequence.get("end"):
        flags |= pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    return {"correlation_id": sequence.get("id", 0), "flags": flags}


def pb_request(r: RequestInputs, model_name: str) -> pb.InferenceRequest:
    """The ``pb_utils.InferenceRequest`` model code sees for one request."""
    of = pb.Tensor._of
    by_name = {name: of(name, array) for name, array in r.inputs.items()}
    if r.sequence is None:  # the usual: no keyword arguments to build
        return pb.InferenceRequest._served(by_name.values(), r.request_id, r.outputs, model_name, 0, 0,
                                           r.parameters, r.cancelled, by_name)  # fmt: skip
    tensors = list(by_name.values())
    return pb.InferenceRequest._served(
        tensors,
        r.request_id,
        r.outputs,
        model_name,
        parameters=r.parameters,
        cancelled=r.cancelled,
        **sequence_fields(r.sequence),
    )


def call_with(execute: Callable[[list[Any]], Any], holder: list[Any]) -> Any:
    """Call ``execute`` with the requests, leaving no reference to them here once it returns (so a
    response sender the model let go of is released at once)."""
    requests = list(holder)
    holder.clear()
    return execute(requests)


def executes_async(model: Any) -> TypeGuard[TritonModel]:
    """Whether ``model`` is a Triton-style model with an ``async def execute``: Triton runs its batches side
    by side, each batch's coroutine on the event loop while the next batch starts (decoupled or not)."""
    return isinstance(model, TritonModel) and inspect.iscoroutinefunction(
        getattr(model.instance, "execute", None)
    )


class _SenderLists(NamedTuple):
    """What :class:`_Senders` keeps per request once a sender or a wait needs it."""

    responses: list[Any]  # what each request's sender sent (None: nothing yet)
    done: list[bool]  # each request answered (its final flag, or closed)
    taken: list[bool]  # each request's sender asked for
    senders: dict[int, weakref.ref[pb.InferenceResponseSender]]


class _Senders:
    """The response senders of a batch of a model that is not decoupled: one response each, then the
    final flag; a sender released without it leaves its request without a response (an error).

    Most such models return their responses and never ask for a sender, so a request's sender is made
    when the model first asks (``get_response_sender``). Until then a request counts as done once the
    model has let go of it (:meth:`all_done` looks at a weak reference): it can no longer answer.
    """

    def __init__(self, n: int, wake: Wake) -> None:
        self._n = n
        self._wake = wake
        self._lock = threading.Lock()
        self._requests: list[weakref.ref[pb.InferenceRequest]] = []
        # each request's response, done and taken flags, and the senders made: made on first use
        # (``_state``), which a batch whose model returns its responses and asks for no sender never has
        self._lists: _SenderLists | None = None
        self.used = False
        self.taken = False  # a sender was asked for (any_taken without the lock: the flag only ever rises)

    def _state(self) -> _SenderLists:
        """The per-request lists (``_lock`` held), made now if nothing needed them before."""
        lists = self._lists
        if lists is None:
            n = self._n
            lists = self._lists = _SenderLists([None] * n, [False] * n, [False] * n, {})
        return lists

    def attach(self, i: int, request: pb.InferenceRequest) -> pb.InferenceRequest:
        # made when asked for (a bound method the request holds: no cycle back to it from here)
        request._make_sender, request._slot = self._sender, i
        self._requests.append(weakref.ref(request))
        return request

    def attach_all(self, requests: Sequence[RequestInputs], model_name: str) -> list[pb.InferenceRequest]:
        """The ``pb_utils`` request of each of ``requests``, in order, each attached (``attach``): one loop,
        where a call of ``attach`` and of ``pb_request`` per request cost more than the work they do."""
        make, refs, ref = self._sender, self._requests, weakref.ref
        out = []
        for i, r in enumerate(requests):
            request = pb_request(r, model_name)
            request._make_sender, request._slot = make, i
            refs.append(ref(request))
            out.append(request)
        return out

    def watch_requests(self) -> None:
        """Wake the pump when a request the model still holds, with no sender taken, is let go of (then
        :meth:`all_done` changes without a delivery)."""
        for ref in self._requests:
            request = ref()
            if request is not None:
                weakref.finalize(request, self._wake.set)
            del request

    def _sender(self, i: int, cancelled: CancelFlag) -> pb.InferenceResponseSender:
        sender = pb.InferenceResponseSender(
            lambda response, final: self._deliver(i, response, final), cancelled, False
        )
        with self._lock:
            state = self._state()
            state.taken[i] = True
            self.taken = True
            state.senders[i] = weakref.ref(sender)
        weakref.finalize(sender, self._deliver, i, None, True)
        return sender

    def _deliver(self, i: int, response: Any, final: bool) -> None:
        with self._lock:
            state = self._state()
            if state.done[i]:
                return  # closed: what came after the request was answered is dropped
            if response is not None:
                state.responses[i] = response
                self.used = True
            state.done[i] = state.done[i] or final
        self._wake.set()

    def all_done(self) -> bool:
        with self._lock:
            state = self._state()
            return all(
                done or (not taken and ref() is None)
                for done, taken, ref in zip(state.done, state.taken, self._requests, strict=True)
            )

    def close(self, i: int) -> None:
        """Request ``i`` is answered by the response execute returned: its sender, if any, takes no more."""
        with self._lock:
            state = self._state()
            state.done[i] = True
            sender = state.senders.get(i)
        live = sender() if sender is not None else None
        if live is not None:
            live._close()

    def any_taken(self) -> bool:
        return self.taken

    def taken_done(self) -> bool:
        """Every sender the model asked for has sent its final flag (or is gone)."""
        with self._lock:
            state = self._state()
            return all(done or not taken for done, taken in zip(state.done, state.taken, strict=True))

    def sent(self) -> list[Any]:
        """The response each request's sender sent so far (None where none)."""
        with self._lock:
            return list(self._state().responses)

    def responses(self) -> list[Any]:
        with self._lock:
            return [
                r if r is not None else pb.InferenceResponse(error="the request's sender sent no response")
                for r in self._state().responses
            ]


class TritonModel(RequestModel):
    def __init__(
        self,
        instance: Any,
        path: Path,
        config: ModelConfig,
        instance_name: str = "",
        threads: ModelThreads | None = None,
    ) -> None:
        self.threads = threads if threads is not None else ModelThreads()  # the worker runtime's
        self.instance = instance
        self.path = path
        self.name = config.name
        self.instance_name = instance_name or f"{config.name}_0_0"  # Triton's, for its error texts
        self.decoupled = config.decoupled

    def execute_requests(self, requests: Sequence[RequestInputs], /) -> Sequence[RequestResult]:
        senders = _Senders(len(requests), self.threads.wake)
        holder = senders.attach_all(requests, self.name)
        try:
            responses, error = self.threads.run(call_with, self.instance.execute, holder), None
        except Exception as exc:
            responses, error = None, exc
        if error is None and type(responses) is list and len(responses) == len(requests):
            if not senders.taken:  # what _conclude answers for a plain list, without its steps
                result = self._result
                return [result(r) for r in responses]
        conclusion = self._conclude(senders, len(requests), responses, error)
        try:
            wait = next(conclusion)
            while True:
                if not self.threads.pump(wait):
                    raise InternalError("the worker is stopping")
                wait = next(conclusion)
        except StopIteration as stop:
            results: list[RequestResult] = stop.value
            return results

    def start_async(self, requests: Sequence[RequestInputs]) -> AsyncCall:
        """Start one batch's ``async def execute`` on the event loop without waiting for it (Triton runs
        such a model's batches side by side); the caller steps the returned call until it is over."""
        senders = _Senders(len(requests), self.threads.wake)
        holder = senders.attach_all(requests, self.name)
        future = self.threads.get().start_coroutine(call_with(self.instance.execute, holder))
        return AsyncCall(self, senders, len(requests), future)

    def _conclude(
        self, senders: _Senders, n: int, responses: Any, error: Exception | None
    ) -> Generator[Callable[[], bool], None, list[RequestResult]]:
        """What an ``execute`` call that returned ``responses`` (or raised ``error``) answers, one result per
        request; yields what to wait for first (senders still to send); raises what fails the whole batch."""
        if error is not None:
            if not senders.used:
                raise error
            # as Triton: what the senders sent stands; the error reaches only requests without a response
            log.warning("event=model_failed model=%s error=%r after=sent_responses", self.name, error)
            failure = model_failure(error, self.name)
            return [self._result(r) if r is not None else failure for r in senders.sent()]
        if responses is None:
            # Triton lets a model that is not decoupled answer through its senders too: one response each,
            # from execute or after it returned; wait until every sender sent its final flag or is gone
            senders.watch_requests()
            yield senders.all_done
            if senders.used:
                responses = senders.responses()
        if responses is None:
            raise InternalError(
                "TritonPythonModel.execute returned None: it must return a list with one InferenceResponse "
                "per request (or set model_transaction_policy { decoupled: true } and answer through "
                "request.get_response_sender())"
            )
        try:
            responses = list(responses)
        except TypeError:
            raise InternalError(
                f"TritonPythonModel.execute returned {type(responses).__name__}: "
                "it must return a list with one InferenceResponse per request"
            ) from None
        if len(responses) != n:
            raise InternalError(
                f"TritonPythonModel.execute returned {len(responses)} responses for {n} "
                "requests: it must return exactly one InferenceResponse per request, in order"
            )
        if senders.any_taken():
            # as Triton: a response sent before execute returned stands (one returned for it is discarded);
            # a returned response closes its request's sender; a None entry waits for its sender
            sent = senders.sent()
            for i, (mine, returned) in enumerate(zip(sent, responses, strict=True)):
                if mine is None and returned is not None:
                    senders.close(i)
            yield senders.taken_done
            sent = senders.sent()
            responses = [mine if mine is not None else r for mine, r in zip(sent, responses, strict=True)]
        return [self._result(r) for r in responses]

    def _result(self, response: Any) -> RequestResult:
        if not isinstance(response, pb.InferenceResponse):
            return InternalError(
                f"TritonPythonModel.execute returned a {type(response).__name__} where an "
                "InferenceResponse was expected"
            )
        if response._error is not None:
            return response_error(response._error)
        outputs = {t._name: t._array for t in response._tensors}  # pb_utils' own classes: their fields
        return RequestOutputs(outputs, response._parameters) if response._parameters else outputs

    def finalize(self) -> None:
        finalize = getattr(self.instance, "finalize", None)
        if finalize is not None:
            finalize()


class AsyncCall:
    """One batch's ``async def execute`` in flight on the event loop (a model that is not decoupled):
    :meth:`step` says whether it is over, then ``results`` holds one result per request, or ``error`` what
    fails them all (the model's own exception, or a wrong answer)."""

    def __init__(self, model: TritonModel, senders: _Senders, n: int, future: Future[Any]) -> None:
        self.model, self.senders, self.n, self.future = model, senders, n, future
        self.results: list[RequestResult] | None = None
        self.error: Exception | None = None
        self._conclusion: Generator[Callable[[], bool], None, list[RequestResult]] | None = None
        self._wait: Callable[[], bool] | None = None

    def step(self) -> bool:
        if self.results is not None or self.error is not None:
            return True
        if self._conclusion is None:
            if not self.future.done():
                return False
            try:
                responses, error = self.future.result(), None
            except Exception as exc:  # the model's own (or the loop's, when it was stopped)
                responses, error = None, exc
            self._conclusion = self.model._conclude(self.senders, self.n, responses, error)
        try:
            while self._wait is None or self._wait():
                self._wait = next(self._conclusion)
        except StopIteration as stop:
            self.results = stop.value
            return True
        except Exception as exc:
            self.error = exc
            return True
        return False
