"""Client regions as a worker sees them: attached once, re-checked against their real size on every batch."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from zinfer.client.errors import InvalidArgument, ShmError
from zinfer.client.protocol import ShmRef
from zinfer.client.shm import Segment


class Pinner(Protocol):
    """Told when a segment is mapped and before it is unmapped (a GPU device page-locks it)."""

    def pin(self, seg: Segment) -> None: ...

    def unpin(self, seg: Segment) -> None: ...


class RegionCache:
    """Attached segments by name. ``begin_batch`` forgets the sizes checked for the previous batch.

    A ``pinner`` (the worker's device) hears of every segment attached and of every one dropped.
    """

    def __init__(self, pinner: Pinner | None = None) -> None:
        self._segments: dict[str, Segment] = {}
        self._checked: dict[str, int] = {}
        self.pinner = pinner

    def begin_batch(self) -> None:
        self._checked.clear()

    def bytes(self, ref: ShmRef) -> npt.NDArray[np.uint8]:
        """The referenced range as a uint8 array over the mapping.

        The segment's size is re-read (``fstat``) once per batch, so a region a client shrank after
        registering it gives a clean error here rather than a SIGBUS on access.
        """
        seg = self._segments.get(ref.region)
        if seg is None:
            try:
                seg = Segment.attach(ref.region)
            except ShmError as exc:
                raise InvalidArgument(f"shared-memory region is not available: {exc}") from None
            self._segments[ref.region] = seg
            if self.pinner is not None:
                self.pinner.pin(seg)
        size = self._checked.get(ref.region)
        if size is None:
            size = min(seg.current_size(), seg.size)
            self._checked[ref.region] = size
        if ref.offset > size or ref.nbytes > size - ref.offset:
            raise InvalidArgument("tensor lies outside its shared-memory region (was the region shrunk?)")
        return np.frombuffer(seg.buf, dtype=np.uint8, count=ref.nbytes, offset=ref.offset)

    def drop(self, name: str) -> None:
        seg = self._segments.pop(name, None)
        self._checked.pop(name, None)
        if seg is not None:
            if self.pinner is not None:
                self.pinner.unpin(seg)
            seg.close(unlink=False)

    def close(self) -> None:
        for name in list(self._segments):
            self.drop(name)
