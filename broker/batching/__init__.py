"""The batching policy: which queued requests go to which instance, and when. Pure: no sockets, no logging,
no clock (time is passed in as seconds on the caller's monotonic clock), so every rule is table-tested.

Entry point: one :class:`~zinfer.broker.batching.batcher.DynamicBatcher` per model, built from its config
with :meth:`~zinfer.broker.batching.batch_policy.BatchPolicy.from_config` (a stateful model gets a
:class:`~zinfer.broker.batching.sequence_batcher.SequenceBatcher` instead). The broker calls ``add(request,
now)`` on arrival, ``expire(now)`` for queue timeouts, ``pop_ready(now, free_instances)`` whenever an
instance is free, and polls no longer than ``next_deadline()``.

How a batch is chosen (Triton's dynamic batcher; ``batcher``'s docstring has every rule): batches are formed
only when an instance is free, so the queue grows while instances are busy. The queue (``priority_queue``:
levels, FIFO within a level, REJECT/DELAY timeouts, ``max_queue_size``) is walked from its head; a request
of another shape cuts the batch, one that would pass ``max_batch_size`` or the batch byte limit ends it.
The largest preferred size reached goes at once; otherwise the batch waits until the oldest request has
waited ``max_queue_delay_microseconds`` (or, with a latency target, until ``adaptive`` says the wait no
longer pays), then goes with what it has.

Modules: ``batch_policy`` (the policy record, queued requests, batches, reasons), ``priority_queue``,
``batcher``, ``adaptive`` (the latency-target mode), ``sequence_batcher`` (sequence batching),
``rate_limiter`` (instance_group.rate_limiter resources and turns), ``ordering`` (preserve_ordering), and
``simulate`` (a virtual-time run of a batcher, for ``zinfer tune`` and the benchmarks).
"""
