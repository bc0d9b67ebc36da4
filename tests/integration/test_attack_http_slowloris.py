"""Attack (issue 30, item 6): HTTP slowloris. One peer opens many connections and trickles header bytes
into each, a byte at a time, never finishing a request head. Before the fix every connection stayed up to
60 s and 1,024 of them locked HTTP out for everyone. Now each peer has a share of the connections
(``--http-peer-connections``: per uid on this host, per address otherwise) and a request head must arrive
within ``--http-header-timeout``; lowered here (40 connections, 2 s) so the test is short.

The trickler is a process of uid 65534 (it imports as root, then drops before opening any socket: the
kernel records a socket's uid when it is made); the victim is this test, as root. Needs root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.conftest import start_server, stop_all
from tests.frontdoor_helpers import free_port, repository, wait_http

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.getuid() != 0, reason="needs root: a victim of uid 0 and a trickler of uid 65534"),
]

SHARE = 40
HEADER_TIMEOUT_S = 2.0
CONNECTIONS = 200
TRICKLE_S = 8.0

TRICKLER = textwrap.dedent(
    """
    import json, os, socket, sys, time, errno

    port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    start = time.monotonic()
    conns = []
    for _ in range(count):
        s = socket.socket()
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        conns.append({"sock": s, "got": b"", "closed_at": None})
    opened = time.monotonic() - start
    for c in conns:
        try:
            c["sock"].send(b"GET /v2/health/ready HTTP/1.1\\r\\n")
        except OSError:
            pass
    while time.monotonic() - start < seconds and any(c["closed_at"] is None for c in conns):
        for c in conns:
            if c["closed_at"] is not None:
                continue
            try:
                data = c["sock"].recv(4096)
                if not data:
                    c["closed_at"] = time.monotonic() - start
                c["got"] += data
                continue
            except BlockingIOError:
                pass
            except OSError:
                c["closed_at"] = time.monotonic() - start
                continue
            try:
                c["sock"].send(b"X")  # one more byte of a header that never ends
            except BlockingIOError:
                pass
            except OSError:
                c["closed_at"] = time.monotonic() - start
        time.sleep(0.25)
    out = {"uid": os.getuid(), "opened_s": opened, "conns": [
        {"closed_at": c["closed_at"], "status": c["got"][:12].decode("latin-1")} for c in conns
    ]}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = repository(tmp_path_factory.mktemp("slowloris"), ("add",))
    url = f"127.0.0.1:{free_port()}"
    server = start_server(
        repo, "--http", url, "--http-peer-connections", str(SHARE),
        "--http-header-timeout", str(HEADER_TIMEOUT_S),
    )  # fmt: skip
    try:
        wait_http(url)
        yield url
    finally:
        stop_all([server])


def _ready_within(url: str) -> float:
    start = time.monotonic()
    with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=10) as r:
        assert r.status == 200
    return time.monotonic() - start


def test_one_peer_trickling_into_many_connections_cannot_hold_the_door(door: str) -> None:
    port = door.rpartition(":")[2]
    trickler = subprocess.Popen(
        [sys.executable, "-c", TRICKLER, port, str(CONNECTIONS), str(TRICKLE_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        latencies = []
        deadline = time.monotonic() + TRICKLE_S
        while time.monotonic() < deadline and trickler.poll() is None:
            latencies.append(_ready_within(door))  # another client, served while the trickle goes on
            time.sleep(0.2)
        out, err = trickler.communicate(timeout=60)
    finally:
        if trickler.poll() is None:
            trickler.kill()
            trickler.wait()
    assert trickler.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["uid"] == 65534
    conns = result["conns"]
    assert len(latencies) >= 5 and max(latencies) < 2.0, latencies
    # beyond its share, the trickler's connections are closed at once, nothing answered ...
    refused = [c for c in conns if c["closed_at"] is not None and c["status"] == ""]
    assert len(refused) >= CONNECTIONS - SHARE, conns
    # ... and those in its share are answered 408 once the head deadline passes, however steady the trickle
    timed_out = [c for c in conns if c["status"].startswith("HTTP/1.1 408")]
    assert len(timed_out) + len(refused) == CONNECTIONS, conns
    assert all(c["closed_at"] < HEADER_TIMEOUT_S + result["opened_s"] + 3.0 for c in timed_out), timed_out
    # and the door serves again as before
    assert _ready_within(door) < 2.0
