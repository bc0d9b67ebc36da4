"""Regions as a worker sees them: mapped once, checked against the broker's word at every use.

A client's region is a sealed memory file the broker holds a descriptor of (``broker.regions``). Each
EXECUTE names, for the client regions of its batch, that descriptor's number and the file's device and
inode (``use_table``). The worker opens ``/proc/<broker>/fd/<n>``, which is the broker's open file itself
(no path in /dev/shm is involved), and maps it only when device and inode match; a cached mapping is used
only while they still match, so a region registered again under the same name is mapped afresh and a name
the batch does not list is refused. Sealed files cannot shrink: no SIGBUS. Any failure to reach a region
(gone, another file, a mapping the kernel refuses) is an ``InvalidArgument`` for the requests naming it.

The server's own segments (``zinfer-s…``, ensemble intermediates) are attached by name, never following a
symlink, and their size is re-read (``fstat``) once per batch.

At most ``max_mapped`` segments stay mapped (least recently used unmapped first, between batches); a mapping
holds one descriptor (``mmap``'s own).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from zinfer.client.errors import InvalidArgument, ShmError
from zinfer.client.protocol import ShmRef
from zinfer.client.shm import Segment, creator_pid

MAX_MAPPED = 512


class Pinner(Protocol):
    """Told when a segment is mapped and before it is unmapped (a GPU device page-locks it)."""

    def pin(self, seg: Segment) -> None: ...

    def unpin(self, seg: Segment) -> None: ...


class RegionCache:
    """Mapped segments by name. ``use_table`` takes an EXECUTE's region table; ``begin_batch`` forgets the
    sizes checked for the previous batch. A ``pinner`` (the worker's device) hears of every segment mapped
    and of every one dropped. ``owner`` is the broker's pid (whose descriptors the table names)."""

    def __init__(self, pinner: Pinner | None = None, owner: int | None = None, max_mapped: int = MAX_MAPPED):
        self._segments: OrderedDict[str, Segment] = OrderedDict()
        self._identity: dict[str, tuple[int, int]] = {}  # client regions: (dev, ino) of the mapped file
        self._checked: dict[str, int] = {}
        self._table: Mapping[str, tuple[int, int, int]] = {}
        self.pinner = pinner
        self.owner = owner
        self.max_mapped = max_mapped

    def use_table(self, table: Mapping[str, tuple[int, int, int]]) -> None:
        """The client regions of the next batch: ``{name: (fd, dev, ino)}`` (``Execute.regions``, every
        entry already checked by ``execute_from_wire``). Unmaps the least recently used beyond the cap."""
        self._table = table
        while len(self._segments) > self.max_mapped:
            self.drop(next(iter(self._segments)))

    @property
    def table(self) -> Mapping[str, tuple[int, int, int]]:
        """The region table in use (a batch that ends later writes its outputs under its own again)."""
        return self._table

    def begin_batch(self) -> None:
        self._checked.clear()

    def _open_client(self, name: str, want: Sequence[int]) -> Segment:
        fd_num, dev, ino = want
        if self.owner is None:
            raise InvalidArgument("shared-memory regions are not available to this worker")
        try:
            fd = os.open(f"/proc/{self.owner}/fd/{fd_num}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            raise InvalidArgument("shared-memory region is no longer registered") from None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        if (st.st_dev, st.st_ino) != (dev, ino):
            os.close(fd)
            raise InvalidArgument("shared-memory region is no longer registered")
        seg = Segment.from_fd(name, fd, st.st_size)
        self._identity[name] = (dev, ino)
        return seg

    def _segment(self, name: str) -> Segment:
        want = self._table.get(name)
        seg = self._segments.get(name)
        if seg is not None:
            if want is None and name not in self._identity:
                self._segments.move_to_end(name)
                return seg  # the server's own
            if want is not None and self._identity.get(name) == (want[1], want[2]):
                self._segments.move_to_end(name)
                return seg
            self.drop(name)  # registered again since, or no longer: never the old bytes
        try:
            if want is not None:
                seg = self._open_client(name, want)
            elif creator_pid(name) is not None:
                seg = Segment.attach(name)
            else:
                raise InvalidArgument("tensor names a shared-memory region that is not registered")
        except ShmError as exc:
            raise InvalidArgument(f"shared-memory region is not available: {exc}") from None
        except OSError as os_exc:  # a mapping the kernel refuses (EPERM under a write seal, ENOMEM, ...)
            raise InvalidArgument(f"shared-memory region cannot be mapped: {os_exc.strerror}") from None
        self._segments[name] = seg
        if self.pinner is not None:
            self.pinner.pin(seg)
        return seg

    def check(self, ref: ShmRef) -> None:
        """Raise ``InvalidArgument`` unless the referenced range can be reached: its region mapped (now, if it
        was not) and the range inside it. A batch checks each request's ranges first, so that a region that
        cannot be mapped fails only the requests naming it."""
        self._within(ref)

    def bytes(self, ref: ShmRef) -> npt.NDArray[np.uint8]:
        """The referenced range as a uint8 array over the mapping."""
        seg = self._within(ref)
        return np.frombuffer(seg.buf, dtype=np.uint8, count=ref.nbytes, offset=ref.offset)

    def array(self, ref: ShmRef, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any] | None:
        """The referenced range as an array of ``shape`` and ``dtype`` over the mapping, in one call (checked
        as :meth:`bytes` checks it); None when the range is not exactly that shape's bytes."""
        seg = self._within(ref)
        try:
            arr: npt.NDArray[Any] = np.ndarray(shape, dtype, seg.buf, ref.offset)
        except (TypeError, ValueError):
            return None
        return arr if arr.nbytes == ref.nbytes else None

    def _within(self, ref: ShmRef) -> Segment:
        seg = self._segment(ref.region)
        size = seg.size
        if seg.named:  # the server's own segment: re-read its size once per batch
            checked = self._checked.get(ref.region)
            if checked is None:
                checked = min(seg.current_size(), seg.size)
                self._checked[ref.region] = checked
            size = checked
        if ref.offset < 0 or ref.nbytes < 0 or ref.offset > size or ref.nbytes > size - ref.offset:
            raise InvalidArgument("tensor lies outside its shared-memory region")
        return seg

    def drop(self, name: str) -> None:
        seg = self._segments.pop(name, None)
        self._checked.pop(name, None)
        self._identity.pop(name, None)
        if seg is not None:
            if self.pinner is not None:
                self.pinner.unpin(seg)
            seg.close(unlink=False)

    def mapped(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        for name in list(self._segments):
            self.drop(name)
