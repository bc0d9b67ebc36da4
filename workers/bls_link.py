"""One worker's link to its own server for business logic scripting (its ``WorkerRuntime.bls``): a
``zinfer.client.Client`` on the server's socket, made on first use, and who is calling (the self-call check).
Models reach it through ``zinfer.workers.bls`` and ``pb_utils``."""

from __future__ import annotations

import threading

from zinfer.client import Client
from zinfer.client.errors import InvalidArgument

__all__ = ["BLS_TIMEOUT_S", "BlsLink"]

BLS_TIMEOUT_S = 60.0


class BlsLink:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._url: str | None = None
        self._model = ""
        self._instances = 1

    def configure(self, url: str | None, model: str, instances: int) -> None:
        """Called by the worker before the model loads: where the server is, and who is calling."""
        self._url, self._model, self._instances = url, model, instances

    def connection(self) -> Client:
        with self._lock:
            if self._client is None:
                if self._url is None:
                    raise InvalidArgument("BLS needs the server's address; this worker was not given one")
                self._client = Client(self._url, timeout=BLS_TIMEOUT_S)
            return self._client

    def check_self_call(self, model: str) -> None:
        if self._model and model == self._model and self._instances <= 1:
            raise InvalidArgument(
                f"model '{model}' calls itself with no other instance free to answer: it would wait forever "
                "(give it more instances, or call another model)"
            )

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
