"""pyzmq's socket calls without pyzmq's per-call Python, for the hot paths of every process.

``zmq.Socket.send`` is a Python method of pyzmq's sugar class: it looks at DRAFT arguments (``routing_id``,
``group``) and then calls the Cython base class's ``send`` again with keywords. ``send`` here is that Cython
method itself, unbound, called with positional arguments: the same libzmq call, the same ``copy``
semantics and errors, about 0.6 µs less per frame (bench: ``bench/micro_zmq_calls.py``). It is used only for
sockets of pyzmq's plain class (``fast(sock)``): a subclass (``zmq.asyncio``, ``zmq.green``) keeps its own
``send``.

``recv`` and ``get`` are Cython already (the sugar class does not override them); ``recv`` here is that
method unbound too, called with positional arguments (no ``copy=`` keyword to parse: about 0.3 µs less per
two-frame reply). ``get(EVENTS)`` costs about 2 µs, of which the ``SocketOption`` enum pyzmq builds per
call is only ~0.3 µs: libzmq itself makes two system calls per query (``getpid`` for its fork check and a
zero-timeout ``poll`` of the socket's mailbox), so a direct ``zmq_getsockopt`` (ctypes) saves little. What
pays is asking less often (``broker.precise_wait``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

__all__ = ["EVENTS", "PLAIN", "POLLIN", "fast", "recv", "send"]

EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)

_PLAIN: type = zmq.Socket
PLAIN = _PLAIN
"""pyzmq's plain socket class: ``fast(sock)`` is ``type(sock) is PLAIN`` (compiled callers test it inline)."""
# pyzmq's Cython socket class; pyzmq's own class where the sugar is not built on it (then nothing is skipped)
_BASE: Any = zmq.backend.Socket if issubclass(_PLAIN, zmq.backend.Socket) else _PLAIN

# ``send(sock, data, flags, copy)``: the Cython ``Socket.send``, unbound, positional arguments only
send: Callable[[Any, Any, int, bool], Any] = _BASE.send
# ``recv(sock, flags, copy)``: the Cython ``Socket.recv``, unbound, positional arguments only
recv: Callable[[Any, int, bool], Any] = _BASE.recv


def fast(sock: Any) -> bool:
    """Whether ``sock`` is of pyzmq's plain socket class, whose ``send`` ``send`` may stand in for."""
    return type(sock) is _PLAIN
