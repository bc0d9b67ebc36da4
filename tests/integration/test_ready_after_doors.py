"""``event=ready`` (and systemd's READY=1 after it) comes only once the front doors' ports are bound: a user
who connects the moment the line appears is answered, not refused."""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path

from tests.conftest import start_server, stop_all
from tests.frontdoor_helpers import free_port


def _connects(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return False
    return True


def test_the_ready_line_comes_after_the_doors_listen(tmp_path: Path) -> None:
    # an empty repository: the models are done at once, while the doors still import their stacks
    repo = tmp_path / "models"
    repo.mkdir()
    grpc, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = start_server(repo, "--grpc", grpc, "--http", http, runtime_dir=tmp_path)
    try:
        # start_server returned when event=ready was logged: both ports take connections now, no retry
        assert _connects(grpc), server.log()
        assert _connects(http), server.log()
        with urllib.request.urlopen(f"http://{http}/v2/health/live", timeout=5) as reply:
            assert reply.status == 200
        line = next(ln for ln in server.log().splitlines() if "event=ready" in ln)
        assert f"grpc={grpc}" in line and f"http={http}" in line and "not_up=" not in line
        listening = server.log().index("event=frontdoor_listening")
        assert listening < server.log().index("event=ready"), server.log()
        assert re.search(r"startup_s=\d", line)
    finally:
        stop_all([server])
