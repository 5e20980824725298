"""deploy/k8s: validated against the real Kubernetes schemas (kubernetes-validate, offline),
parsed with PyYAML and cross-checked (no cluster needed)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ferry.server.metrics import FerryMetrics
from ferry.server.settings import load_settings
from tests.deploy.deploy_support import DEPLOY, ROOT, ferry_series_names

pytestmark = pytest.mark.unit

K8S = DEPLOY / "k8s"
# The oldest Kubernetes release the manifests target (autoscaling/v2 and the probes they use are
# older), and the newest whose schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Kinds outside Kubernetes' own API, for which kubernetes-validate has no schema: kustomize's file,
# the Prometheus Operator's CRD and the Inference Extension's InferencePool (checked against its
# CRD below). The cross-checks below cover them.
NO_SCHEMA = {"Kustomization", "ServiceMonitor", "InferencePool"}
# llm-d's copy of the Gateway API Inference Extension's InferencePool CRD (llm-d/
# llm-d-inference-scheduler, config/crd/bases/inference.networking.k8s.io_inferencepools.yaml).
INFERENCE_POOL_CRD = ROOT / "tests/deploy/schemas/llm-d-inferencepools-crd.yaml"


def k8s_documents() -> list[tuple[str, dict]]:
    """(file name, document) for every YAML document under deploy/k8s."""
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict]:
    """kind -> manifest (one of each kind, except ConfigMaps keyed by name)."""
    out: dict[str, dict] = {}
    for _, doc in k8s_documents():
        if doc["kind"] == "Kustomization":
            continue
        key = doc["metadata"]["name"] if doc["kind"] == "ConfigMap" else doc["kind"]
        assert key not in out, f"two {key} manifests"
        out[key] = doc
    return out


@pytest.fixture(scope="module")
def container(manifests) -> dict:
    (ferry,) = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    return ferry


def _routes() -> set[str]:
    from ferry.server.app import create_app
    from ferry.server.settings import Settings

    return set(create_app(Settings()).openapi()["paths"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_pass_the_kubernetes_schemas(version):
    """Strict: a misspelt or misplaced field fails, not only a missing or mistyped one."""
    kinds, errors = set(), []
    for name, doc in k8s_documents():
        kinds.add(doc["kind"])
        if doc["kind"] in NO_SCHEMA:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(doc, version, strict=True)
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{name} ({doc['kind']}): {exc.message}")
    assert not errors, f"against Kubernetes {version}:\n" + "\n".join(errors)
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"} <= kinds


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_every_manifest_has_api_version_kind_and_name(manifests):
    for doc in manifests.values():
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]


def test_ports_line_up(manifests, container, tmp_path):
    (tmp_path / "ferry.toml").write_text(manifests["ferry-config"]["data"]["ferry.toml"])
    settings = load_settings(tmp_path / "ferry.toml", environ={})
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    # What the ConfigMap's ferry.toml listens on, and nothing else.
    assert ports == {"http": settings.port, "grpc": settings.grpc_port}
    service = {port["name"]: port for port in manifests["Service"]["spec"]["ports"]}
    assert set(service) == set(ports)
    assert all(service[name]["targetPort"] == name for name in ports)
    (endpoint,) = manifests["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"


def test_selectors_match_the_pods(manifests):
    pod_labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for selector in (
        manifests["Deployment"]["spec"]["selector"]["matchLabels"],
        manifests["Service"]["spec"]["selector"],
    ):
        assert selector.items() <= pod_labels.items()
    service_labels = manifests["Service"]["metadata"]["labels"]
    assert manifests["ServiceMonitor"]["spec"]["selector"]["matchLabels"].items() <= (
        service_labels.items()
    )
    target = manifests["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "Deployment",
        manifests["Deployment"]["metadata"]["name"],
    )


def test_probes_hit_routes_ferry_serves(container):
    routes = _routes()
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        http = container[probe]["httpGet"]
        assert http["path"] in routes, f"{probe}: {http['path']} is not a Ferry route"
        assert http["port"] == "http"
    assert "/metrics" in routes


def test_config_map_is_a_valid_ferry_config(manifests, container, tmp_path):
    config = manifests["ferry-config"]["data"]["ferry.toml"]
    (tmp_path / "ferry.toml").write_text(config)
    settings = load_settings(tmp_path / "ferry.toml", environ={})
    assert settings.host == "0.0.0.0"
    # Everything else is what the repository's ferry.toml says, model by model and key by key.
    repo = load_settings(ROOT / "ferry.toml", environ={})
    assert _in_image(repo.model_dump(exclude={"host"}), ROOT) == _in_image(
        settings.model_dump(exclude={"host"}), Path("/app")
    )
    # The config is mounted where the container's args read it.
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    config_arg = container["args"][container["args"].index("--config") + 1]
    assert Path(config_arg).parent == Path(mount["mountPath"])
    # Model paths are the image's (Dockerfile: /app/artifacts/models/...).
    for model in settings.models:
        assert model.path.is_absolute() and str(model.path).startswith("/app/")


def _in_image(config: object, root: Path) -> object:
    """Paths under `root` as the image lays them out (relative to /app), the rest unchanged."""
    if isinstance(config, dict):
        return {key: _in_image(value, root) for key, value in config.items()}
    if isinstance(config, list | tuple):
        return [_in_image(value, root) for value in config]
    if isinstance(config, Path):
        return str(config.relative_to(root) if config.is_absolute() else config)
    return config


def test_grace_period_covers_prestop_and_drain(manifests, container):
    config = tomllib.loads(manifests["ferry-config"]["data"]["ferry.toml"])
    drain = config["server"]["drain_timeout_s"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    grace = manifests["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert 2 <= pre_stop <= 15
    assert grace >= drain + pre_stop + 1, (grace, drain, pre_stop)


def test_gpu_limit_and_non_root(manifests, container):
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0


def test_hpa_scales_on_a_ferry_metric_through_the_adapter(manifests):
    (metric,) = manifests["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    adapter = yaml.safe_load(manifests["ferry-prometheus-adapter"]["data"]["config.yaml"])
    (rule,) = [r for r in adapter["rules"] if r["name"]["as"] == name]
    source = rule["seriesQuery"].split("{")[0]
    assert source in ferry_series_names(), f"{source} is not a metric Ferry exports"
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert "<<.Series>>" in rule["metricsQuery"]
    spec = manifests["HorizontalPodAutoscaler"]["spec"]
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]


# The fields of an `engineConfigs` entry, as llm-d's endpoint picker reads them
# (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go, engineConfigParams).
EPP_ENGINE_FIELDS = {
    "name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec",
    "cacheInfoSpec", "cacheBlockSizeLabelName", "cacheNumBlocksLabelName",
    "cacheBlockSizeSpec", "cacheNumBlocksSpec",
}  # fmt: skip
EPP_SPEC = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>[^{}]+)\})?$")


def test_the_endpoint_pickers_engine_entry_names_ferrys_gauges(manifests):
    config = yaml.safe_load(manifests["ferry-endpoint-picker"]["data"]["ferry-plugins.yaml"])
    assert config["kind"] == "EndpointPickerConfig"
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    (engine,) = extractor["parameters"]["engineConfigs"]
    pod_labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["llm-d.ai/engine-type"] == engine["name"]
    assert set(engine) <= EPP_ENGINE_FIELDS
    gauges = {f.name: f for f in FerryMetrics().registry.collect() if f.type == "gauge"}
    for field, meaning in (
        ("queuedRequestsSpec", "waiting"),
        ("runningRequestsSpec", "running"),
        ("kvUsageSpec", "kv positions"),
        ("loraSpec", "lora"),
    ):
        match = EPP_SPEC.match(engine[field])
        assert match, f"{field}: {engine[field]!r} is not a metric spec the EPP parses"
        gauge = gauges.get(match["name"])
        assert gauge is not None, f"{field}: {match['name']} is not a gauge Ferry exports"
        assert meaning in gauge.documentation.lower()
    # The LoRA info carries the labels the EPP splits (extractor.go, populateLoRAMetrics).
    lora = EPP_SPEC.match(engine["loraSpec"])["name"]  # type: ignore[index]  # matched above
    collector = FerryMetrics().llm_lora_info
    assert {"running_lora_adapters", "waiting_lora_adapters", "max_lora"} <= set(collector.LABELS)
    assert collector.describe()[0].name == lora
    scorers = {p["type"] for p in config["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "lora-affinity-scorer"} <= scorers


def _closed(schema: object) -> object:
    """The CRD's schema with its objects closed: the API server prunes fields it does not know
    (structural schemas), so a misspelt one would be dropped silently; here it fails."""
    if isinstance(schema, dict):
        out = {key: _closed(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and (not schema.get("x-kubernetes-preserve-unknown-fields"))
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(value) for value in schema]
    return schema


@pytest.fixture(scope="module")
def inference_pool_schema() -> dict:
    crd = yaml.safe_load(INFERENCE_POOL_CRD.read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    schema = _closed(served["schema"]["openAPIV3Schema"])
    # metadata is the API server's ObjectMeta, not the CRD's to describe.
    schema["properties"]["metadata"] = {"type": "object"}  # type: ignore[index]
    return {"group": crd["spec"]["group"], "version": served["name"], "schema": schema}


def test_the_inference_pool_is_valid_against_its_crd(manifests, inference_pool_schema):
    pool = manifests["InferencePool"]
    schema = inference_pool_schema
    assert pool["apiVersion"] == f"{schema['group']}/{schema['version']}"
    jsonschema.validate(pool, schema["schema"])
    broken = {**pool, "spec": {**pool["spec"], "targetPort": 8000}}  # misspelt: refused
    with pytest.raises(jsonschema.ValidationError, match="targetPort"):
        jsonschema.validate(broken, schema["schema"])


def test_the_inference_pool_selects_ferrys_pods_on_its_http_port(manifests, container):
    spec = manifests["InferencePool"]["spec"]
    pod_labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    http = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert [p["number"] for p in spec["targetPorts"]] == [http]  # /metrics and the OpenAI routes
    assert spec["appProtocol"] == "http"
