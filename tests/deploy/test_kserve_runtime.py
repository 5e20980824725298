"""deploy/kserve/ferry-runtime.yaml is a ClusterServingRuntime KServe accepts: valid against the
CRD's own schema (config/crd/full/serving.kserve.io_clusterservingruntimes.yaml of kserve/kserve,
committed in tests/deploy/schemas/), with the formats, protocols, model path and non-root user
this issue asks for, and a command line Ferry's own parser takes."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from ferry.cli import build_parser
from tests.deploy.deploy_support import DEPLOY, ROOT

pytestmark = pytest.mark.unit

CRD = yaml.safe_load(
    (ROOT / "tests/deploy/schemas/kserve-clusterservingruntimes-crd.yaml").read_text()
)
RUNTIME = yaml.safe_load((DEPLOY / "kserve" / "ferry-runtime.yaml").read_text())


def schema(version: str) -> dict:
    (served,) = [v for v in CRD["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


def test_the_runtime_is_valid_against_kserves_crd():
    assert RUNTIME["kind"] == CRD["spec"]["names"]["kind"]
    group, version = RUNTIME["apiVersion"].split("/")
    assert group == CRD["spec"]["group"]
    jsonschema.validate(RUNTIME, schema(version))


def test_a_misspelt_field_is_refused_by_the_same_schema():
    # The check can fail: the CRD's schema closes its objects where KServe does.
    broken = {**RUNTIME, "spec": {**RUNTIME["spec"], "protocolVersions": "v2"}}
    try:
        jsonschema.validate(broken, schema("v1alpha1"))
    except jsonschema.ValidationError as exc:
        assert "protocolVersions" in str(exc.absolute_path)
    else:
        raise AssertionError("a string for protocolVersions passed KServe's schema")


def test_formats_protocols_model_path_and_user():
    spec = RUNTIME["spec"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"onnx", "sklearn", "xgboost", "lightgbm"}
    assert formats["onnx"]["autoSelect"] is True
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"  # the name KServe looks for
    assert "{{.Name}}=/mnt/models" in container["args"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["allowPrivilegeEscalation"] is False
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"USER {security['runAsUser']}:" in dockerfile


def test_ferrys_parser_takes_the_runtimes_command_line():
    (container,) = RUNTIME["spec"]["containers"]
    command, *args = container["args"]
    assert command == "ferry"
    parsed = build_parser().parse_args([a.replace("{{.Name}}", "fraud") for a in args])
    assert parsed.command == "serve" and parsed.port == 8080 and parsed.host == "0.0.0.0"
