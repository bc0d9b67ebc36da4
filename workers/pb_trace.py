"""``pb_utils.InferenceTrace``: a request's trace, which a BLS call continues (``trace=request.trace()``)."""

from __future__ import annotations


class InferenceTrace:
    """A request's W3C ``traceparent`` as the server gave it to the model; empty when it is not traced."""

    def __init__(self, context: str = "") -> None:
        self._context = context

    def get_context(self) -> str:
        return self._context


NO_TRACE = InferenceTrace()
