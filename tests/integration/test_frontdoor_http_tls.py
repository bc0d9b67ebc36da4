"""The HTTP front door over TLS and mutual TLS (``--tls-cert``, ``--tls-key``, ``--tls-client-ca``), with
certificates made for the test by ``openssl``: a client that trusts the CA is served (tritonclient.http
with ``ssl=True`` included), a plain-HTTP client and a client that does not trust the CA are not, and with
a client CA a client without a certificate is refused while one with a signed certificate is served."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import start_server, stop_all
from tests.frontdoor_helpers import free_port, repository

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificates"),
]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    names = ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem", "client.key", "client.csr",
             "client.pem", "san.cnf")  # fmt: skip
    f = {n: folder / n for n in names}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(f["ca.key"]),
             "-out", str(f["ca.pem"]), "-days", "2", "-subj", "/CN=zinfer test CA")  # fmt: skip
    f["san.cnf"].write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        key, csr, pem = (str(f[f"{who}.{ext}"]) for ext in ("key", "csr", "pem"))
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", f"/CN=zinfer test {who}")  # fmt: skip
        _openssl("x509", "-req", "-in", csr, "-CA", str(f["ca.pem"]), "-CAkey", str(f["ca.key"]),
                 "-CAcreateserial", "-out", pem, "-days", "2", "-extfile", str(f["san.cnf"]))  # fmt: skip
    return f


def _wait_tls(url: str, context: ssl.SSLContext, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"https://{url}/v2/health/ready", timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the TLS front door at {url} did not become ready within {timeout} s")
        time.sleep(0.1)


def _get(url: str, context: ssl.SSLContext | None, path: str = "/v2/models/add/ready") -> int:
    scheme = "https" if context is not None else "http"
    with urllib.request.urlopen(f"{scheme}://{url}{path}", timeout=10, context=context) as r:
        return int(r.status)


def test_tls_serves_clients_that_trust_the_ca_and_no_others(tmp_path: Path) -> None:
    certs = _certificates(tmp_path)
    url = f"127.0.0.1:{free_port()}"
    repo = repository(tmp_path, ("add",))
    server = start_server(repo, "--http", url, "--tls-cert", str(certs["server.pem"]), "--tls-key",
                          str(certs["server.key"]))  # fmt: skip
    try:
        trusting = ssl.create_default_context(cafile=str(certs["ca.pem"]))
        _wait_tls(url, trusting)
        assert _get(url, trusting) == 200
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            _get(url, None)  # plain HTTP to a TLS port
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _get(url, ssl.create_default_context())  # does not trust the test CA
        client = httpclient.InferenceServerClient(
            url, ssl=True, ssl_options={"ca_certs": str(certs["ca.pem"])}
        )
        try:
            a = np.ones((1, 1), dtype=np.float32)
            inputs = [httpclient.InferInput(n, [1, 1], "FP32") for n in ("INPUT_A", "INPUT_B")]
            for inp in inputs:
                inp.set_data_from_numpy(a)
            assert client.infer("add", inputs).as_numpy("OUTPUT_SUM").tolist() == [[2.0]]
        finally:
            client.close()
    finally:
        stop_all([server])


def test_mutual_tls_refuses_a_client_without_a_signed_certificate(tmp_path: Path) -> None:
    certs = _certificates(tmp_path)
    url = f"127.0.0.1:{free_port()}"
    repo = repository(tmp_path, ("add",))
    server = start_server(repo, "--http", url, "--tls-cert", str(certs["server.pem"]), "--tls-key",
                          str(certs["server.key"]), "--tls-client-ca", str(certs["ca.pem"]))  # fmt: skip
    try:
        with_cert = ssl.create_default_context(cafile=str(certs["ca.pem"]))
        with_cert.load_cert_chain(str(certs["client.pem"]), str(certs["client.key"]))
        _wait_tls(url, with_cert)
        assert _get(url, with_cert) == 200
        body = urllib.request.urlopen(f"https://{url}/v2", timeout=10, context=with_cert).read()
        assert json.loads(body)["name"] == "zinfer"
        without = ssl.create_default_context(cafile=str(certs["ca.pem"]))
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError, OSError)):
            _get(url, without)
        assert _get(url, with_cert) == 200  # the refused handshake hurt nothing
    finally:
        stop_all([server])
