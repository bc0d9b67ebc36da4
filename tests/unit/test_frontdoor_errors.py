"""The front door's error mapping: zinfer's exceptions as Triton's gRPC codes, HTTP statuses and texts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from zinfer.client.errors import (
    ConnectionFailed,
    InternalError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Unsupported,
)
from zinfer.frontdoor import bridge as bridge_module
from zinfer.frontdoor.bridge import Bridge, parse_version
from zinfer.frontdoor.errors import FrontDoorError, triton_error


@pytest.mark.parametrize(
    ("exc", "code", "status", "text"),
    [
        (NotFound("unknown model 'm'"), "NOT_FOUND", 404, "Request for unknown model: 'm' is not found"),
        (
            NotFound("unknown version 3 of model 'm'"),
            "NOT_FOUND",
            404,
            "Request for unknown model: 'm' version 3 is not found",
        ),
        (
            Unavailable("model 'm' is not loaded"),
            "UNAVAILABLE",
            503,
            "Request for unknown model: 'm' has no available versions",
        ),
        (InvalidArgument("bad shape"), "INVALID_ARGUMENT", 400, "bad shape"),
        (ResourceExhausted("queue full"), "RESOURCE_EXHAUSTED", 429, "queue full"),
        (Unsupported("nope"), "UNIMPLEMENTED", 501, "nope"),
        (ConnectionFailed("gone"), "UNAVAILABLE", 503, "gone"),
        (InternalError("model raised"), "INTERNAL", 500, "model raised"),
        (FrontDoorError("INVALID_ARGUMENT", 400, "refused"), "INVALID_ARGUMENT", 400, "refused"),
    ],
)
def test_errors_map_to_tritons_codes_and_texts(exc: Exception, code: str, status: int, text: str) -> None:
    answer = triton_error(exc)
    assert (answer.grpc_code, answer.http_status, answer.message) == (code, status, text)


def test_an_unexpected_exception_reveals_nothing() -> None:
    answer = triton_error(KeyError("/secret/path"))
    assert answer.grpc_code == "INTERNAL" and "secret" not in answer.message


@pytest.mark.parametrize("version", ["x", "-1", "1.5", "9" * 19, " 1", "\u0663", "wrong_specification"])
def test_a_malformed_version_is_an_invalid_argument_in_tritons_words(version: str) -> None:
    """tritonclient's grpc_explicit_*_content_client examples match on this text."""
    with pytest.raises(InvalidArgument) as err:
        parse_version("m", version)
    assert str(err.value).startswith(f"failed to get model version from specified version string '{version}'")
    assert triton_error(err.value).grpc_code == "INVALID_ARGUMENT"


def test_versions_parse() -> None:
    assert parse_version("m", "") == 0 and parse_version("m", "12") == 12


def test_health_is_false_when_no_broker_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe gets a quick False, not an error after the bridge's 60 s request timeout."""
    monkeypatch.setattr(bridge_module, "HEALTH_TIMEOUT_S", 0.5)

    async def run() -> list[bool]:
        bridge = Bridge(f"ipc://{tmp_path / 'nobody.sock'}")
        try:
            return await asyncio.wait_for(
                asyncio.gather(bridge.server_live(), bridge.server_ready(), bridge.model_ready("m")), 10
            )
        finally:
            await bridge.close()

    assert list(asyncio.run(run())) == [False, False, False]
