"""The front door with TLS: a non-loopback address is allowed once TLS is on, and with a client CA only
clients presenting a certificate it signed get an answer (mutual TLS), through tritonclient's ssl options."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import MODELS, ServerProcess, start_server, stop_all, wait_for
from tests.frontdoor_helpers import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("openssl") is None, reason="needs the openssl command to make certificates"
    ),
]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    f = {n: folder / n for n in ("ca.key", "ca.crt", "server.key", "server.crt", "client.key", "client.crt")}
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(f["ca.key"]), "-out", str(f["ca.crt"]), "-days", "1",
             "-subj", "/CN=zinfer test CA")  # fmt: skip
    for who, san in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        csr = folder / f"{who}.csr"
        ext = folder / f"{who}.ext"
        ext.write_text(san + "\n")
        _openssl("req", "-new", *ec, "-keyout", str(f[f"{who}.key"]), "-out", str(csr), "-subj", f"/CN={who}")
        sign = ("-CA", str(f["ca.crt"]), "-CAkey", str(f["ca.key"]), "-CAcreateserial", "-days", "1")
        _openssl("x509", "-req", "-in", str(csr), *sign, "-out", str(f[f"{who}.crt"]), "-extfile", str(ext))
    return f


@pytest.fixture(scope="module")
def tls_door(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, int, dict[str, Path]]]:
    certs = _certificates(tmp_path_factory.mktemp("tls"))
    port = free_port()
    tls = ("--tls-cert", str(certs["server.crt"]), "--tls-key", str(certs["server.key"]))
    server = start_server(MODELS, "--grpc", f"0.0.0.0:{port}", *tls, "--tls-client-ca", str(certs["ca.crt"]))
    try:
        yield server, port, certs
    finally:
        stop_all([server])


def _client(port: int, certs: dict[str, Path], with_cert: bool) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        f"127.0.0.1:{port}",
        ssl=True,
        root_certificates=str(certs["ca.crt"]),
        private_key=str(certs["client.key"]) if with_cert else None,
        certificate_chain=str(certs["client.crt"]) if with_cert else None,
    )


def test_mutual_tls(tls_door: tuple[ServerProcess, int, dict[str, Path]]) -> None:
    _, port, certs = tls_door
    client = _client(port, certs, with_cert=True)

    def ready() -> bool:
        try:
            return bool(client.is_server_ready(client_timeout=2))
        except InferenceServerException:
            return False

    try:
        wait_for(ready, 60, "the TLS front door to answer")
        assert client.get_model_metadata("add", as_json=True)["name"] == "add"
    finally:
        client.close()
    anonymous = _client(port, certs, with_cert=False)
    try:
        with pytest.raises(InferenceServerException) as err:
            anonymous.is_server_live(client_timeout=5)
        assert err.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    finally:
        anonymous.close()
    plain = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")  # no TLS at all
    try:
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
    finally:
        plain.close()
