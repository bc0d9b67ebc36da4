"""Triton's CUDA shared memory extension, answered as a Triton built without GPU support answers it.

zinfer's front door holds no CUDA shared memory regions: its workers take tensors from system shared
memory (``sysshm``) and copy them to their GPU themselves. So, on both doors, as Triton answers without
GPUs: the status lists no region (a named one is not found), unregistering one region or all succeeds
(Triton's examples unregister everything at their start and end), and registering is refused with
Triton's text, which says why.
"""

from __future__ import annotations

from zinfer.client.errors import InvalidArgument, NotFound

__all__ = ["register", "status", "unregister"]


def status(name: str = "") -> tuple[()]:
    """No region; a named one is not found (Triton's NOT_FOUND text)."""
    if name:
        raise NotFound(f"Unable to find cuda shared memory region: '{name[:256]}'")
    return ()


def register(name: str) -> None:
    raise InvalidArgument(
        f"failed to register CUDA shared memory region: '{name[:256]}', GPUs not supported (zinfer's "
        "front door takes tensors in system shared memory: tritonclient.utils.shared_memory)"
    )


def unregister(name: str = "") -> None:
    """Nothing to forget: as in Triton, an unknown name is not an error."""
