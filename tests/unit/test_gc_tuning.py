"""``gc_tuning.tune_for_serving``, in a process of its own (it changes the collector of the process that
calls it, and this one is pytest's): start-up objects frozen, the youngest generation's threshold raised,
cyclic garbage made afterwards still collected."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from zinfer.client.gc_tuning import YOUNG_THRESHOLD, tune_for_serving

class Node:
    pass

before = Node()
tune_for_serving()
assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10), gc.get_threshold()
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()  # the interpreter's and zinfer's start-up heap
frozen = gc.get_freeze_count()
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: reference counting alone never frees it
import weakref
gone = weakref.ref(a)
del a, b
assert gone() is not None
gc.collect()
assert gone() is None, "a cycle made after the freeze must still be collected"
assert gc.get_freeze_count() == frozen
print("ok")
"""


def test_start_up_is_frozen_the_young_threshold_raised_and_later_cycles_still_collected() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
