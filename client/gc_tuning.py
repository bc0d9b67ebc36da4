"""The cyclic garbage collector of zinfer's own long-running processes: the broker, each model worker and
each front-door process call ``tune_for_serving`` once they are set up. The client classes never call it: a
process that uses ``Client`` or ``AsyncClient`` keeps whatever collector settings it has. It sits in
``client/`` only because the broker, the workers and the front doors all call it and ``client`` is the one
package all three may import (the import rules); the SDK does not export it or load it.

Two changes, both measured (``add0`` with 128 in flight, ``bench/results`` and the issue 15 note):

- ``gc.freeze()``: what exists after start-up (modules, the model and its weights, configs) moves to a
  permanent generation that no collection walks again. Full collections used to traverse all of it while
  requests waited: p99 23 ms -> 13 ms.
- a youngest-generation threshold of 50,000 allocations instead of 700: a request allocates a few hundred
  short-lived objects (headers, records, arrays), almost all freed by reference counting; collecting every
  700 allocations walked them many times per request. Broker CPU per request 44 -> 38 us.

Cyclic garbage is still collected: by the youngest generation every 50,000 allocations (milliseconds
under load), and the older two keep Python's ratios to it (``_OLDER``).
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger(__name__)

YOUNG_THRESHOLD = 50_000
_OLDER = (10, 10)  # Python's own: generation 1 every 10 collections of 0, generation 2 every 10 of 1


def tune_for_serving() -> None:
    """Freeze what start-up made and collect the youngest generation less often (see the module)."""
    gc.collect()  # start-up's own garbage goes now, not into the frozen generation
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *_OLDER)
    log.info("event=gc_tuned pid=%d frozen=%d threshold=%s", os.getpid(), gc.get_freeze_count(),
             ",".join(map(str, gc.get_threshold())))  # fmt: skip
