"""A request the dynamic batcher refuses gets its own error, compiled or not: queue full -> Unavailable, a
priority outside the model's levels -> InvalidArgument, inputs over --max-batch-bytes -> ResourceExhausted
(``scheduler.Batching.add``). Compiled, a name bound by several ``except`` handlers was typed as the first
handler's (native) class, so the second and third refusals raised TypeError (an InternalError reply); every
compiled module therefore binds one name per handler type (client, worker and door modules too: harmless while
their exception classes are interpreted, a TypeError the day one is compiled)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zinfer.broker.batching.batcher import BatchPolicy
from zinfer.broker.compiled import COMPILED
from zinfer.broker.pending import Pending
from zinfer.broker.scheduler import Batching
from zinfer.client.errors import InvalidArgument, ResourceExhausted, Unavailable
from zinfer.client.protocol import InferRequest
from zinfer.modelconfig.scheduling import QueuePolicy

ROOT = Path(__file__).resolve().parents[2]


def _pending(seq: int, priority: int = 0, nbytes: int = 8) -> Pending:
    request = InferRequest(f"r{seq}", "m", 1, (), priority=priority)
    return Pending(seq, b"client", request, [], (), 1, 0.0, input_bytes=nbytes)


def _batching() -> Batching:
    queue = QueuePolicy(max_queue_size=1)
    return Batching(BatchPolicy(4, max_queue_delay_us=100, priority_levels=2, default_priority_level=2,
                                default_queue_policy=queue, max_batch_bytes=64))  # fmt: skip


def test_each_refusal_has_its_own_error() -> None:
    sched = _batching()
    sched.add(_pending(1), "a", 0.0, False)
    with pytest.raises(Unavailable, match="Exceeds maximum queue size"):
        sched.add(_pending(2), "a", 0.0, False)
    with pytest.raises(InvalidArgument, match="priority 3 is not in"):
        sched.add(_pending(3, priority=3), "a", 0.0, False)
    with pytest.raises(ResourceExhausted, match="over the 64 byte limit"):
        sched.add(_pending(4, priority=1, nbytes=65), "a", 0.0, False)
    assert len(sched) == 1


def _compiled_modules() -> list[Path]:
    return [ROOT / Path(*n.split(".")[1:]).with_suffix(".py") for n in COMPILED]


@pytest.mark.parametrize("path", _compiled_modules(), ids=list(COMPILED))
def test_a_compiled_module_binds_one_name_per_handler_type(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        types: dict[str, set[str]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
                types.setdefault(node.name, set()).add(ast.unparse(node.type))
        mixed = {name: kinds for name, kinds in types.items() if len(kinds) > 1}
        assert not mixed, (
            f"{path.name}:{fn.lineno} {fn.name} binds one name to several handler types: {mixed}"
        )
