"""Issue 30, item 8: Triton's CUDA shared memory API on both doors, through tritonclient's own calls.

zinfer's front door holds no CUDA shared memory regions (its workers take tensors from system shared
memory). Before, gRPC answered every CUDA call UNIMPLEMENTED while HTTP answered 200, so a tritonclient
program that unregisters everything at its start and end (Triton's own examples do) failed over gRPC.
Now both answer as a Triton built without GPU support: status lists no region (a named one is not
found), unregister (one or all) succeeds, and register says why it cannot, with Triton's text.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.frontdoor_helpers import repository, serve_front_doors

pytestmark = pytest.mark.integration

HANDLE = base64.b64encode(bytes(64)).decode()  # a cudaIpcMemHandle_t's size, all zero
NO_GPU = "failed to register CUDA shared memory region: 'gpu0', GPUs not supported"


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    repo = repository(tmp_path_factory.mktemp("cudashm"), ("add",))
    with serve_front_doors(repo) as urls:
        yield urls


def test_grpc_cuda_shared_memory_answers_as_triton_without_gpus(doors: tuple[str, str]) -> None:
    client = grpcclient.InferenceServerClient(doors[1])
    try:
        client.unregister_cuda_shared_memory()  # every region: none, and no error
        client.unregister_cuda_shared_memory("never-registered")
        assert client.get_cuda_shared_memory_status(as_json=True) == {}
        assert len(client.get_cuda_shared_memory_status().regions) == 0
        with pytest.raises(InferenceServerException) as err:
            client.get_cuda_shared_memory_status("nope")
        assert err.value.status() == "StatusCode.NOT_FOUND"
        assert "Unable to find cuda shared memory region: 'nope'" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("gpu0", base64.b64decode(HANDLE), 0, 64)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert NO_GPU in err.value.message()
        client.unregister_system_shared_memory()  # the system shm calls of the same examples
        assert client.get_system_shared_memory_status(as_json=True) == {}
    finally:
        client.close()


def test_http_cuda_shared_memory_answers_as_triton_without_gpus(doors: tuple[str, str]) -> None:
    client = httpclient.InferenceServerClient(doors[0])
    try:
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("never-registered")
        assert client.get_cuda_shared_memory_status() == []
        with pytest.raises(InferenceServerException) as err:
            client.get_cuda_shared_memory_status("nope")
        assert err.value.status() == "404"
        assert "Unable to find cuda shared memory region: 'nope'" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("gpu0", HANDLE, 0, 64)
        assert err.value.status() == "400" and NO_GPU in err.value.message()
    finally:
        client.close()
