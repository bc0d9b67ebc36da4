"""deploy/kubernetes: every manifest validated offline, and what the manifests must say to one another.

- The Kubernetes kinds (Deployment, Service, PodDisruptionBudget, NetworkPolicy) are checked by
  ``kubernetes-validate`` against the Kubernetes JSON schemas it bundles (strict: an unknown field fails), for
  the oldest and the newest version it knows.
- KServe's ServingRuntime and InferenceService are custom resources that those schemas lack. They are checked
  against ``kserve_schemas.json`` beside this file: a schema written from the fields KServe documents for
  ``ServingRuntimeSpec`` and the v1beta1 predictor (``ModelSpec``, ``PredictorExtensionSpec``,
  ``ComponentExtensionSpec``), with every container, volume and resource field checked by the Kubernetes
  definitions themselves. It is not KServe's own CRD, so a field KServe added later may be missing from it.
- Then the cross-checks no schema can make: the command line parses with ``zinfer serve``'s own parser, the
  security rule for non-loopback addresses, probes, ports, the metrics annotation, volumes, selectors and the
  drain budget.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import referencing
import yaml
from kubernetes_validate import utils as kv_utils

from zinfer.broker.cli import parse_args
from zinfer.broker.server_options import ServerOptions

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KSERVE_SCHEMAS = Path(__file__).with_name("kserve_schemas.json")
K8S_VERSIONS = (kv_utils.all_versions()[0], kv_utils.latest_version())
KSERVE_KINDS = ("ServingRuntime", "ClusterServingRuntime", "InferenceService")
LOOPBACK = ("127.", "localhost", "[::1]")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((str(path.relative_to(DEPLOY)), doc))
    return docs


DOCS = _documents()


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _, d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _kserve_validator(kind: str) -> jsonschema.Draft202012Validator:
    schemas = json.loads(KSERVE_SCHEMAS.read_text())
    key = "ServingRuntime" if kind == "ClusterServingRuntime" else kind
    version = kv_utils.latest_version()
    defs = kv_utils.schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
    )
    registry: referencing.Registry[Any] = referencing.Resource.from_contents(defs) @ referencing.Registry()
    return jsonschema.Draft202012Validator(schemas[key], registry=registry)


def _validate(doc: dict[str, Any], version: str) -> None:
    if doc["kind"] in KSERVE_KINDS:
        _kserve_validator(doc["kind"]).validate(doc)
    else:
        kv_utils.validate(doc, version, strict=True)


def _args(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", [])[1:], *container.get("args", [])]


def _flags(argv: list[str]) -> dict[str, str]:
    out = {}
    for arg in argv:
        key, _, value = arg.partition("=")
        out[key] = value
    return out


def _zinfer_containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, doc in DOCS:
        if doc["kind"] == "Deployment":
            yield name, doc["spec"]["template"]["spec"]["containers"][0]
        elif doc["kind"] in ("ServingRuntime", "ClusterServingRuntime"):
            yield name, doc["spec"]["containers"][0]


def test_the_manifests_are_the_expected_set() -> None:
    kinds = sorted(d["kind"] for _, d in DOCS)
    assert kinds == sorted(
        [
            "Deployment",
            "Service",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "ServingRuntime",
            "InferenceService",
        ]
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,doc", DOCS, ids=[f"{n}:{d['kind']}:{d['metadata']['name']}" for n, d in DOCS])
def test_each_manifest_validates_offline(name: str, doc: dict[str, Any], version: str) -> None:
    _validate(doc, version)


@pytest.mark.parametrize(
    "kind,path,value",
    [
        ("Deployment", ("spec", "template", "spec", "containers", 0, "livenessProbes"), {}),  # a typo
        ("Deployment", ("spec", "replicas"), "two"),
        ("Service", ("spec", "ports", 0, "port"), "eight thousand"),
        ("ServingRuntime", ("spec", "protocolVersions", 0), "v3"),
        ("ServingRuntime", ("spec", "containers", 0, "imagePullPolicy"), ["Always"]),
        ("ServingRuntime", ("spec", "containerz"), []),
        ("InferenceService", ("spec", "predictor", "model", "protocolVersion"), "rest"),
        ("InferenceService", ("spec", "predictor", "model", "resources", "limitz"), {}),
        ("InferenceService", ("spec", "predictor", "model", "storageUri"), "/models"),
    ],
)
def test_the_validation_rejects_a_broken_manifest(kind: str, path: tuple[Any, ...], value: Any) -> None:
    """The schemas are strict enough to catch a typo or a wrong type (else the tests above prove nothing)."""
    doc = copy.deepcopy(_one(kind, None if kind != "Service" else "zinfer"))
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        _validate(doc, K8S_VERSIONS[-1])


@pytest.mark.parametrize("name,container", list(_zinfer_containers()))
def test_the_command_line_is_one_zinfer_serve_accepts(name: str, container: dict[str, Any]) -> None:
    assert container["command"] == ["zinfer"]
    argv = _args(container)
    assert argv[0] == "serve"
    args = parse_args(argv)  # zinfer's own parser: an unknown flag or a bad value exits (SystemExit)
    flags = _flags(argv)
    assert {"--http", "--grpc", "--metrics", "--model-repository"} <= set(flags)
    assert str(args.model_repository) == flags["--model-repository"]


@pytest.mark.parametrize("name,container", list(_zinfer_containers()))
def test_a_non_loopback_front_door_has_tls_or_says_insecure_remote(
    name: str, container: dict[str, Any]
) -> None:
    flags = _flags(_args(container))
    remote = [f for f in ("--http", "--grpc") if not flags[f].startswith(LOOPBACK)]
    assert remote, "in a pod the front door must bind an address the Service reaches"
    tls = "--tls-cert" in flags and "--tls-key" in flags
    assert tls != ("--insecure-remote" in flags), "exactly one of TLS and --insecure-remote"
    scheme = "HTTPS" if tls else "HTTP"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in container:
            assert container[probe]["httpGet"].get("scheme", "HTTP") == scheme, probe


def test_the_deployment_serves_tls_from_a_mounted_secret() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    flags = _flags(_args(container))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"] for v in pod["volumes"] if "secret" in v}
    for flag in ("--tls-cert", "--tls-key"):
        owner = [n for n, p in mounts.items() if flags[flag].startswith(p.rstrip("/") + "/")]
        assert owner and owner[0] in secrets, f"{flag} is not a file of a mounted Secret"


def test_the_deployment_probes_gpu_metrics_and_model_volume() -> None:
    deployment = _one("Deployment")
    template = deployment["spec"]["template"]
    pod = template["spec"]
    container = pod["containers"][0]
    flags = _flags(_args(container))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(flags["--http"].rsplit(":", 1)[1])
    assert ports["grpc"] == int(flags["--grpc"].rsplit(":", 1)[1])
    assert ports["metrics"] == int(flags["--metrics"].rsplit(":", 1)[1])
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", ports["http"])
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    notes = template["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == ports["metrics"]
    assert notes["prometheus.io/path"] == "/metrics"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    repo = mounts[flags["--model-repository"]]
    assert repo["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "persistentVolumeClaim" in volumes[repo["name"]]
    shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert flags["--runtime-dir"] in mounts


def test_the_drain_fits_in_the_grace_period() -> None:
    """SIGTERM comes after preStop; the broker then drains (drain_timeout_s) and stops its workers
    (exit_timeout_s). Only then may the kubelet's SIGKILL come."""
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    flags = _flags(_args(container))
    fields = ServerOptions.__dataclass_fields__
    drain = float(flags.get("--drain-timeout", fields["drain_timeout_s"].default))  # type: ignore[arg-type]
    exit_ = float(flags.get("--exit-timeout", fields["exit_timeout_s"].default))  # type: ignore[arg-type]
    pause = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pause + drain + exit_ + 4
    strategy = _one("Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0
    assert _one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_services_policy_and_budget_select_the_pods_and_name_their_ports() -> None:
    template = _one("Deployment")["spec"]["template"]
    labels = template["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert _one("Deployment")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for name in ("zinfer", "zinfer-pods"):
        service = _one("Service", name)
        assert service["spec"]["selector"].items() <= labels.items()
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    assert _one("Service", "zinfer-pods")["spec"]["clusterIP"] == "None"
    assert _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    policy = _one("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    allowed = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert allowed == set(ports.values())


def test_the_inference_service_uses_the_runtime_with_the_v2_protocol() -> None:
    runtime = _one("ServingRuntime")
    model = _one("InferenceService")["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] in ("v2", "grpc-v2")
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert int(model["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    container = runtime["spec"]["containers"][0]
    flags = _flags(_args(container))
    assert flags["--model-repository"] == "/mnt/models"  # where KServe puts storageUri
    assert container["ports"][0]["containerPort"] == int(flags["--http"].rsplit(":", 1)[1])
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    notes = runtime["spec"]["annotations"]
    assert int(notes["prometheus.kserve.io/port"]) == int(flags["--metrics"].rsplit(":", 1)[1])
    assert notes["prometheus.kserve.io/path"] == "/metrics"
