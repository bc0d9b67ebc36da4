"""The server's slots for ensemble intermediates (``ensemble_run.ServerSlots``): real segments in /dev/shm,
freed slots kept for the next request of the same size, and given back when the arena runs out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zinfer.broker import ensemble_run
from zinfer.broker.ensemble_run import ServerRegions, ServerSlots
from zinfer.broker.regions import RegionTable
from zinfer.client.errors import InternalError, ResourceExhausted, UnknownRegion
from zinfer.client.protocol import ShmRef
from zinfer.client.shm import SHM_DIR, Segment, new_server_name


def _named(size: int) -> Segment:
    return Segment.create(size, new_server_name())


@pytest.fixture
def slots() -> Iterator[ServerSlots]:
    s = ServerSlots(1 << 16, 1 << 17, _named)
    yield s
    s.close()


def test_a_freed_slot_is_taken_again_by_the_next_request_of_its_size(slots: ServerSlots) -> None:
    a = slots.alloc(1000)
    slots.free(a)
    assert slots.alloc(1000) is a  # kept, not carved again
    b = slots.alloc(2000)  # another size is carved from the arena, clear of the first
    assert b is not a and (b.segment is not a.segment or b.offset >= a.offset + 1000)


def test_segments_are_known_by_name_and_unlinked_at_close() -> None:
    s = ServerSlots(1 << 16, 1 << 20, _named)
    first = s.alloc(100)
    big = s.alloc(1 << 17)  # past the first segment: the arena grows
    names = set(s.segments)
    assert {first.region, big.region} == names and len(names) == 2
    assert all((SHM_DIR / n).exists() for n in names)
    s.free(first)
    s.close()
    assert not any((SHM_DIR / n).exists() for n in names)


def test_kept_slots_go_back_to_the_arena_when_it_has_no_room(slots: ServerSlots) -> None:
    small = [slots.alloc(1 << 14) for _ in range(8)]  # all of the arena's 128 KiB
    with pytest.raises(ResourceExhausted):
        slots.alloc(1 << 14)
    for slot in small:
        slots.free(slot)  # kept for 16 KiB requests
    whole = slots.alloc(1 << 15)  # another size: the kept ones are given back and coalesce
    assert whole.nbytes == 1 << 15
    with pytest.raises(ResourceExhausted):  # nothing kept any more: the arena's own refusal
        for _ in range(8):
            slots.alloc(1 << 15)


def test_at_most_keep_slots_are_kept(monkeypatch: pytest.MonkeyPatch, slots: ServerSlots) -> None:
    monkeypatch.setattr(ensemble_run, "KEEP_SLOTS", 2)  # read at each free
    taken = [slots.alloc(4096) for _ in range(4)]
    for slot in taken:
        slots.free(slot)
    again = [slots.alloc(4096) for _ in range(4)]
    assert sum(1 for slot in again if any(slot is t for t in taken)) == 2  # the two kept, two carved anew


def test_the_region_check_knows_the_servers_segments(slots: ServerSlots) -> None:
    slot = slots.alloc(256)
    clients = RegionTable()
    regions = ServerRegions(clients, slots.segments)
    regions.check(b"c", ShmRef(slot.region, slot.offset, slot.nbytes))
    size = slots.segments[slot.region].size
    with pytest.raises(InternalError, match="outside the server's region"):
        regions.check(b"c", ShmRef(slot.region, size - 8, 16))
    with pytest.raises(UnknownRegion):  # not the server's: the client's own regions are asked
        regions.check(b"c", ShmRef("zinfer-nope", 0, 8))
    clients.close()
