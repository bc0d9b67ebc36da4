"""The KServe v2 front door: gRPC and HTTP processes that any Triton client can call.

Each front-door process is an ordinary client of the broker: one ``Bridge`` (an ``AsyncClient``) per
process carries every request to it, so the broker stays one loop. The protocol layers (``grpc_*`` for
``inference.GRPCInferenceService``, ``http_*`` for KServe v2 REST) turn their wire forms into the neutral
records of ``bridge_records`` and back; ``errors`` maps zinfer's exceptions onto Triton's status codes and
texts; ``sysshm`` is Triton's system shared memory registry. ``process`` is the process main that
``zinfer serve --grpc/--http`` starts, supervises and restarts.

Nothing else in zinfer imports this package except the ``zinfer`` command's lazy import.
"""
