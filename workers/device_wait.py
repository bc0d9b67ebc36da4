"""What a device waits for while a batch runs, and the hook the worker gives it (its look-ahead).

Its own module so that ``zinfer.workers.gpu`` and ``zinfer.workers.device`` (which opens a GPU lazily) do not
import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["DeviceWait", "WaitHook"]


class DeviceWait(Protocol):
    """What a device waits for: ``fd`` turns readable once it may be done (poll it beside a socket, never
    spin); ``done()`` says whether it is."""

    fd: int

    def done(self) -> bool: ...


WaitHook = Callable[[DeviceWait], None]
"""Run while a device waits for its batch, with what it waits for."""
