"""Packed frames: many small inline frames of one message carried as one frame.

A message whose command byte has ``PACKED`` set carries, instead of its header, ``[refs, header]``, then one
blob frame, then its large frames: each ``ref`` is ``[offset, nbytes]``, a slice of the blob, or an int, the
number of a large frame. Receivers rebuild the message's frames in order (slices are zero-copy views of the
blob), so nothing above the framing sees a difference. Sending one frame instead of dozens saves a send and
a receive per frame in every process on the way (client, broker, worker). Frames of ``COPY_THRESHOLD`` bytes
or more stay frames of their own (ZeroMQ sends them without a copy).

Pure; every ref is hostile until checked (``ProtocolError``, never an index or slice error).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import ProtocolError

PACKED = 0x80
"""Set in a command byte: the message's frames are packed."""

COPY_THRESHOLD = 1 << 16
"""Frames at least this large are sent without copying, and never packed."""

Frame = bytes | memoryview


def nbytes(frame: Frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


def worth_packing(frames: Sequence[Frame]) -> bool:
    """Two small frames or more: one blob is cheaper than sending each."""
    small = 0
    for f in frames:
        if nbytes(f) < COPY_THRESHOLD:
            small += 1
            if small >= 2:
                return True
    return False


def pack(frames: Sequence[Frame]) -> tuple[list[Any], bytes, list[Frame]]:
    """The refs, the blob of the small frames and the large frames, for ``frames`` in order."""
    refs: list[Any] = []
    small: list[Frame] = []
    large: list[Frame] = []
    at = 0
    for f in frames:
        n = nbytes(f)
        if n < COPY_THRESHOLD:
            refs.append((at, n))
            small.append(f)
            at += n
        else:
            refs.append(len(large))
            large.append(f)
    return refs, b"".join(small), large


def unpack(refs: Any, blob: Frame, large: Sequence[Frame], limit: int) -> list[Frame]:
    """The frames ``refs`` name (at most ``limit``): slices of ``blob`` and each large frame once."""
    if not isinstance(refs, list) or len(refs) > limit:
        raise ProtocolError(f"packed frames: refs must be a list of at most {limit}")
    view = memoryview(blob).cast("B") if not isinstance(blob, bytes) else memoryview(blob)
    size = view.nbytes
    out: list[Frame] = []
    used = 0
    for ref in refs:
        # the usual ref, [offset, nbytes] of plain ints inside the blob: one test (``type(...) is int``
        # refuses bools as the checks below do); anything else is checked below, which names the fault
        if type(ref) is list and len(ref) == 2:
            off, n = ref
            if type(off) is int and type(n) is int and off >= 0 and n >= 0 and off + n <= size:
                out.append(view[off : off + n])
                continue
        if isinstance(ref, int) and not isinstance(ref, bool):
            if ref != used or ref >= len(large):
                raise ProtocolError("packed frames: large frames must be named once each, in order")
            out.append(large[ref])
            used += 1
            continue
        if not (isinstance(ref, list) and len(ref) == 2):
            raise ProtocolError("packed frames: a ref is [offset, nbytes] or a large frame's number")
        off, n = ref
        for v in (off, n):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ProtocolError("packed frames: offset and nbytes must be non-negative integers")
        if off + n > size:
            raise ProtocolError("packed frames: a slice past the end of the blob")
        out.append(view[off : off + n])
    if used != len(large):
        raise ProtocolError("packed frames: a large frame no ref names")
    return out
