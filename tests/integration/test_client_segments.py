"""``Client.register_segment`` / ``unregister_segment``: a segment managed outside the client's arena."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ServerProcess
from zinfer.client import Client
from zinfer.client.errors import NotFound
from zinfer.client.shm import Segment

pytestmark = pytest.mark.integration


def test_register_and_unregister_a_segment_of_ones_own(bundled_server: ServerProcess) -> None:
    seg = Segment.create_sealed(1 << 20)
    try:
        with Client(bundled_server.url, timeout=30) as c:
            c.register_segment(seg)
            c.unregister_segment(seg)
            with pytest.raises(NotFound):  # already forgotten
                c.unregister_segment(seg)
            c.register_segment(seg)  # and again, then left for close() to leave alone
            x = np.full((1, 1), 3.0, np.float32)
            out = c.infer("add", {"INPUT_A": x, "INPUT_B": x}).as_numpy("OUTPUT_SUM")
            np.testing.assert_array_equal(out, 2 * x)
            c.unregister_segment(seg)
    finally:
        seg.close()
