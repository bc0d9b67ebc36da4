"""Attack (issue 30, item 1): system shared memory must not cross users.

The server runs as root; the attacker is a process of uid 65534 (nobody) on the same host, talking to the
front door through tritonclient over loopback HTTP and gRPC. It names root's mode-0600 ``/dev/shm`` segment
in a registration (before the fix the door checked the file against its own uid, root, and took it: the
attacker then read root's bytes and wrote outputs into them). It must be refused; its own segments are
accepted; root may register anyone's; and a region root registered does not exist for the attacker (not in
its status, not usable in an inference, not its to unregister).

The attacker script runs as root long enough to import what it needs and make its (unconnected) clients
(the interpreter and the virtual environment may live where nobody cannot read), then drops to 65534
before it opens any socket: the kernel records the uid of a socket at its creation, and that is what the
door asks for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.frontdoor_helpers import repository, serve_front_doors

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.getuid() != 0, reason="needs root: a server of uid 0 and an attacker of uid 65534"),
]

NOBODY = 65534

ATTACKER = textwrap.dedent(
    """
    import json, os, sys
    import encodings.idna  # noqa: F401  (imported lazily by name resolution: after setuid it cannot be read)
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    http_url, grpc_url, root_key, own_h, own_g, root_region = sys.argv[1:7]
    # made now (they import lazily), connected only by their first call, after the drop
    h = httpclient.InferenceServerClient(http_url)
    g = grpcclient.InferenceServerClient(grpc_url)
    import gevent.socket
    gevent.socket.getaddrinfo("127.0.0.1", 80)  # gevent's resolver and thread pool load on first use
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    out = {"uid": os.getuid()}
    for key in (own_h, own_g):
        fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, 64)
        os.close(fd)

    def attempt(what, call):
        try:
            result = call()
            out[what] = "ok" if result is None else result
        except InferenceServerException as exc:
            out[what] = "refused: " + str(exc)

    attempt("http_root_file", lambda: h.register_system_shared_memory("steal_h", root_key, 64))
    attempt("grpc_root_file", lambda: g.register_system_shared_memory("steal_g", root_key, 64))
    attempt("http_own_file", lambda: h.register_system_shared_memory("own_h", own_h, 64))
    attempt("grpc_own_file", lambda: g.register_system_shared_memory("own_g", own_g, 64))
    out["http_status"] = sorted(r["name"] for r in h.get_system_shared_memory_status())
    out["grpc_status"] = sorted(g.get_system_shared_memory_status(as_json=True).get("regions", {}))
    attempt("http_root_region_status", lambda: h.get_system_shared_memory_status(root_region))

    def infer_from_root_region():
        inp = httpclient.InferInput("INPUT_A", [1, 1], "FP32")
        inp.set_shared_memory(root_region, 4)
        other = httpclient.InferInput("INPUT_B", [1, 1], "FP32")
        other.set_data_from_numpy(np.zeros((1, 1), np.float32))
        result = h.infer("add", [inp, other])
        return "read " + repr(result.as_numpy("OUTPUT_SUM").tolist())

    attempt("http_infer_root_region", infer_from_root_region)

    def grpc_write_root_region():
        a = grpcclient.InferInput("INPUT_A", [1, 1], "FP32")
        a.set_data_from_numpy(np.full((1, 1), 6.0, np.float32))
        b = grpcclient.InferInput("INPUT_B", [1, 1], "FP32")
        b.set_data_from_numpy(np.full((1, 1), 1.0, np.float32))
        o = grpcclient.InferRequestedOutput("OUTPUT_SUM")
        o.set_shared_memory(root_region, 4)
        g.infer("add", [a, b], outputs=[o])
        return "wrote"

    attempt("grpc_infer_into_root_region", grpc_write_root_region)
    attempt("grpc_unregister_root_region", lambda: g.unregister_system_shared_memory(root_region))
    attempt("http_unregister_all", lambda: h.unregister_system_shared_memory())
    g.close()
    h.close()
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    repo = repository(tmp_path_factory.mktemp("xuser"), ("add",))
    with serve_front_doors(repo) as urls:
        yield urls


@pytest.fixture
def segments() -> Iterator[dict[str, str]]:
    """Keys of root's secrets (mode 0600, holding 42.0: one unregistered, one root registers), the attacker's
    own two, and one root hands over to the attacker."""
    tag = uuid.uuid4().hex[:10]
    keys = {k: f"/fdx_{k}_{tag}" for k in ("root", "root_registered", "own_h", "own_g", "given")}
    for which in ("root", "root_registered"):
        fd = os.open("/dev/shm" + keys[which], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.write(fd, np.full(16, 42.0, np.float32).tobytes())
        os.close(fd)
    given = Path("/dev/shm" + keys["given"])
    given.write_bytes(bytes(64))
    os.chown(given, NOBODY, NOBODY)
    yield keys
    for key in keys.values():
        Path("/dev/shm" + key).unlink(missing_ok=True)


def _attack(http_url: str, grpc_url: str, keys: dict[str, str], root_region: str) -> dict[str, object]:
    args = [http_url, grpc_url, keys["root"], keys["own_h"], keys["own_g"], root_region]
    run = subprocess.run(
        [sys.executable, "-c", ATTACKER, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_another_users_segment_cannot_be_registered_over_http_or_grpc(
    doors: tuple[str, str], segments: dict[str, str]
) -> None:
    http_url, grpc_url = doors
    root = httpclient.InferenceServerClient(http_url)
    root_grpc = grpcclient.InferenceServerClient(grpc_url)
    root_region = f"roots_{uuid.uuid4().hex[:8]}"
    try:
        root.register_system_shared_memory(root_region, segments["root_registered"], 64)
        out = _attack(http_url, grpc_url, segments, root_region)
        assert out["uid"] == NOBODY
        for door in ("http", "grpc"):
            verdict = str(out[f"{door}_root_file"])
            assert verdict.startswith("refused") and "belongs to another user" in verdict, (door, verdict)
            assert out[f"{door}_own_file"] == "ok", out  # its own segment: accepted
        # root's region does not exist for the attacker: not listed, not readable, not writable, not its own
        assert out["http_status"] == ["own_g", "own_h"] and out["grpc_status"] == ["own_g", "own_h"], out
        for what in ("http_root_region_status", "http_infer_root_region", "grpc_infer_into_root_region"):
            assert str(out[what]).startswith("refused") and "Unable to find" in str(out[what]), (what, out)
        assert out["grpc_unregister_root_region"] == "ok"  # as in Triton: unknown names are no error ...
        status = {r["name"] for r in root.get_system_shared_memory_status()}
        assert root_region in status  # ... and root's region is still there, its bytes untouched
        for which in ("root", "root_registered"):
            secret = np.frombuffer(Path("/dev/shm" + segments[which]).read_bytes(), np.float32)
            assert secret.tolist() == [42.0] * 16
        assert "steal_h" not in status and "steal_g" not in status
        assert out["http_unregister_all"] == "ok"
        assert {r["name"] for r in root.get_system_shared_memory_status()} == {root_region}  # only its own
        # root may register anyone's segment
        root_grpc.register_system_shared_memory("given", segments["given"], 64)
        assert "given" in root_grpc.get_system_shared_memory_status(as_json=True)["regions"]
    finally:
        try:
            root.unregister_system_shared_memory()
        except InferenceServerException:
            pass
        root.close()
        root_grpc.close()
