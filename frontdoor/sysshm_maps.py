"""How the front door copies bytes between a caller's system shared memory segment and its own memory.

``pread``/``pwrite`` on the segment's descriptor cost 2.5 to 3.5 times a ``memcpy`` of the same bytes on
tmpfs (the kernel looks each 4 KiB page up and copies it on its own; ``bench/probe_big_shm.py`` measures
both). Where the compiled helper ``_shmcopy`` is built, a segment is mapped once (``MAP_SHARED``, kept with
its descriptor while registered) and copied with a plain ``memcpy``: a segment truncated under the copy
raises SIGBUS inside it, which ``_shmcopy`` turns into a failed copy (``False``) instead of the end of the
process, so the caller still reports "smaller than registered". Without the helper (a pure-Python install)
the copies stay ``pread``/``pwrite``. The caller checks the segment's size (``fstat``) before each copy;
the guard covers a truncation between that check and the copy.

A big copy can run later on another thread (``later_read``, ``later_write``: the front door's copy pool,
``copy_pool``): the mapping is looked up on the caller's thread, with the size check, and the copy holds
that mapping, never the descriptor (which an unregister may close, and a later ``open`` reuse, meanwhile).
A mapping closed before its copy starts (the region unregistered) fails that copy (``False``).
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

try:
    from . import _shmcopy as _compiled  # type: ignore[attr-defined]
except ImportError:  # a pure-Python install: pread and pwrite
    _compiled = None

__all__ = ["Copy", "SegmentMaps", "mapped_copies"]

_Ident = tuple[int, int]  # a segment's (device, inode)
Copy = Callable[[], bool]  # a copy to run later, on any thread: False when the segment held fewer bytes


def mapped_copies() -> bool:
    """Whether copies go through mappings (the compiled helper is built)."""
    return _compiled is not None


class SegmentMaps:
    """Mappings of open segments by identity; ``read``/``write`` copy through them, or through ``pread``
    and ``pwrite`` where the helper is missing. Not thread-safe: the caller holds its lock for ``drop``."""

    def __init__(self, helper: ModuleType | None = _compiled) -> None:
        self._helper = helper
        self._maps: dict[_Ident, mmap.mmap] = {}

    def read(self, ident: _Ident, fd: int, start: int, out: memoryview) -> bool:
        """``len(out)`` bytes of the segment from ``start`` into ``out`` (a writable byte view); False when
        the segment holds fewer."""
        n = len(out)
        mapping = self._map(ident, fd, start + n) if n else None
        if mapping is None or self._helper is None:
            return os.preadv(fd, [out], start) == n
        return bool(self._helper.copy(out, 0, mapping, start, n))

    def write(self, ident: _Ident, fd: int, start: int, data: memoryview) -> bool:
        """``data`` into the segment at ``start``; False when the segment holds fewer bytes from there."""
        n = len(data)
        mapping = self._map(ident, fd, start + n) if n else None
        if mapping is None or self._helper is None:
            return os.pwrite(fd, data, start) == n
        return bool(self._helper.copy(mapping, start, data, 0, n))

    def later_read(self, ident: _Ident, fd: int, start: int, out: memoryview) -> Copy | None:
        """``read`` to run later on any thread, through the segment's mapping as it is now (None: no
        mapping, the caller copies now with ``read``)."""
        n = len(out)
        mapping = self._map(ident, fd, start + n) if n else None
        if mapping is None or self._helper is None:
            return None
        return functools.partial(_guarded, self._helper, out, 0, mapping, start, n)

    def later_write(self, ident: _Ident, fd: int, start: int, data: memoryview) -> Copy | None:
        """``write`` to run later on any thread, as ``later_read``."""
        n = len(data)
        mapping = self._map(ident, fd, start + n) if n else None
        if mapping is None or self._helper is None:
            return None
        return functools.partial(_guarded, self._helper, mapping, start, data, 0, n)

    def drop(self, ident: _Ident) -> None:
        mapping = self._maps.pop(ident, None)
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # another thread's copy holds it: unmapped when that copy lets go
                pass

    def _map(self, ident: _Ident, fd: int, end: int) -> mmap.mmap | None:
        """A mapping of the segment that covers ``[0, end)`` (None: no helper, or the segment is shorter,
        which the caller's copy through ``pread``/``pwrite`` then reports)."""
        if self._helper is None:
            return None
        mapping = self._maps.get(ident)
        if mapping is not None and len(mapping) >= end:
            return mapping
        size = os.fstat(fd).st_size
        if size < end:
            return None
        self.drop(ident)  # the segment grew past the old mapping
        try:
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):  # no address space, too many mappings: pread and pwrite still work
            return None
        self._maps[ident] = mapping
        return mapping


def _guarded(helper: ModuleType, dst: Any, dst_offset: int, src: Any, src_offset: int, n: int) -> bool:
    """The helper's copy; False also when the mapping was closed before it started (``ValueError``)."""
    try:
        return bool(helper.copy(dst, dst_offset, src, src_offset, n))
    except ValueError:  # mmap closed: the region was unregistered (or replaced) meanwhile
        return False
