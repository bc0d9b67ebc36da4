"""``CallerShm``: the system shared memory registry (``sysshm.SystemShm``) as one caller sees it.

A caller made with a ``later`` list collects its big copies (``OFFLOAD_MIN_BYTES`` and over, where the
segment is mapped) instead of making them: every check is made at once, as for any copy, and the copy
itself is left in ``later`` for the front door to run off its event loop (``SystemShm.copies``), where
``memcpy`` runs without the GIL while the loop serves other requests. An input read that way must not be
used, and an output's region not answered, before those copies ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from .copy_pool import OFFLOAD_MIN_BYTES

if TYPE_CHECKING:
    from .sysshm import RegionStatus, SystemShm

__all__ = ["CallerShm"]


class CallerShm:
    """``SystemShm`` as one caller sees it: the same operations with the caller's uid filled in. The uid
    is asked of ``uid_of`` once, when an operation first needs it (a gRPC call that names no region never
    looks its peer up). With ``later``, big copies are checked now and left there to run (module doc)."""

    __slots__ = ("_later", "_shm", "_uid", "_uid_of")

    def __init__(
        self,
        shm: SystemShm,
        uid: int | None = None,
        uid_of: Callable[[], int | None] | None = None,
        later: list[Callable[[], None]] | None = None,
    ) -> None:
        self._shm = shm
        self._uid = uid
        self._uid_of = uid_of
        self._later = later

    @property
    def uid(self) -> int | None:
        if self._uid_of is not None:
            self._uid, self._uid_of = self._uid_of(), None
        return self._uid

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._shm.register(name, key, offset, byte_size, uid=self.uid)

    def unregister(self, name: str = "") -> None:
        self._shm.unregister(name, uid=self.uid)

    def status(self, name: str = "") -> tuple[RegionStatus, ...]:
        return self._shm.status(name, uid=self.uid)

    def read(
        self, name: str, offset: int, byte_size: int, out: npt.NDArray[Any] | None = None
    ) -> npt.NDArray[Any]:
        if out is not None and self._later is not None and byte_size >= OFFLOAD_MIN_BYTES:
            copy = self._shm.read_later(name, offset, byte_size, out, uid=self.uid)
            if copy is not None:
                self._later.append(copy)
                return out
        return self._shm.read(name, offset, byte_size, out, uid=self.uid)

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview) -> None:
        if self._later is not None and memoryview(data).nbytes >= OFFLOAD_MIN_BYTES:
            copy = self._shm.write_later(name, offset, byte_size, data, uid=self.uid)
            if copy is not None:
                self._later.append(copy)
                return
        self._shm.write(name, offset, byte_size, data, uid=self.uid)
