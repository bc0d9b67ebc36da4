"""Triton's model configuration (``config.pbtxt``): the reader, typed records, the repository layout.

Shared by the broker and the workers; imports no zinfer package but ``zinfer.client``.

* ``pbtxt`` reads protobuf text into a generic tree; ``block`` hands out one message block's fields by
  name and type and rejects the fields nobody asked for.
* One module per group of Triton messages, each record beside its decoder: ``tensors`` (input, output,
  batch_input, batch_output), ``scheduling`` (dynamic_batching, queue policies), ``sequence_batching``
  (strategies, control inputs, implicit state), ``ensemble``, ``instances`` (instance_group, rate
  limiter), ``optimization``, ``model_options`` (warmup, transaction policy, response cache, metrics,
  operations, agents), ``version_policy``; ``record_base`` holds what they share.
* ``model_config`` is the whole record (:class:`ModelConfig`, ``load_model_config``); ``features`` says
  which fields zinfer implements; ``parameters`` reads zinfer's own ``parameters`` keys; ``signature``
  is a model's tensors as the hot paths look them up; ``repository`` scans a model repository.

To add a Triton field: its record field and its decoding in the group's module; if zinfer does not act on
it yet, a line in ``features.FEATURES`` (and in ``SUPPORTED_FEATURES`` once it does).
"""
