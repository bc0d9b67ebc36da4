"""Pinning one of zinfer's own processes to a CPU list: a model worker (``cpu_affinity``) or a front door
(``frontdoor_cpus``), each given the list as ``--cpus 0,1`` on its command line. It sits in ``client/`` only
because the workers and the front doors both call it and ``client`` is the one package both may import (the
import rules); the SDK does not export it.

``os.sched_setaffinity(0, ...)`` sets the calling thread's mask only, and importing a worker or a door has
already started threads (numpy's BLAS pool, for one). ``pin_process`` sets the mask of every thread there is;
threads started later take their creator's.
"""

from __future__ import annotations

import os

__all__ = ["cpu_arg", "parse_cpu_arg", "pin_process"]


def cpu_arg(cpus: frozenset[int]) -> str:
    """The ``--cpus`` value the broker gives a worker or a door: ``{3, 1}`` -> ``"1,3"``."""
    return ",".join(map(str, sorted(cpus)))


def parse_cpu_arg(text: str) -> set[int]:
    """The CPUs of a ``--cpus`` value (:func:`cpu_arg`)."""
    return {int(c) for c in text.split(",")}


def pin_process(cpus: set[int]) -> None:
    """Run every thread of this process on ``cpus``; raises OSError when the kernel refuses the list (none of
    its CPUs online)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
