"""The state one worker process holds besides its socket: a :class:`WorkerRuntime`.

It holds the running batch's cancellation flags (``cancel_flags``), the model thread and event loop with
their wake and pump (``model_loop``), the link to the server for business logic scripting (``bls_link``)
and the model's custom metrics (``metric_registry``). The worker makes one and passes it to what needs it:
the runner of its model, the model (``TritonModel``), the heartbeat.

The model-facing API that Triton defines as module functions (``pb_utils.InferenceRequest.exec()``,
``pb_utils.load_model``, ``pb_utils.MetricFamily``, zinfer's own ``workers.bls.infer``) has no object to
hand it in, so it asks :func:`current`: the runtime the worker installed (:func:`install`), or, in a
process that is no worker (``auto_complete``, a unit test), one made on first use.
"""

from __future__ import annotations

from .bls_link import BlsLink
from .cancel_flags import CancelFlags
from .metric_registry import MetricRegistry
from .model_loop import ModelThreads

__all__ = ["WorkerRuntime", "current", "install"]


class WorkerRuntime:
    __slots__ = ("bls", "cancels", "metrics", "threads")

    def __init__(self) -> None:
        self.cancels = CancelFlags()
        self.threads = ModelThreads()
        self.bls = BlsLink()
        self.metrics = MetricRegistry()

    def close(self) -> None:
        self.threads.close()
        self.bls.close()


_process: list[WorkerRuntime] = []  # the one runtime of this process, once made or installed


def install(runtime: WorkerRuntime) -> None:
    """Make ``runtime`` the one the model-facing API reaches (the worker, before it loads the model)."""
    _process[:] = [runtime]


def current() -> WorkerRuntime:
    if not _process:
        _process.append(WorkerRuntime())
    return _process[0]
