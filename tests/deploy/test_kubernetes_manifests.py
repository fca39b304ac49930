"""The Kubernetes manifests (deploy/kubernetes): every kustomization renders with
``kubectl kustomize``, every object it makes validates against one pinned Kubernetes
schema (strict: an unknown field fails), and what matters holds: both ClusterRoles are
exactly what the README explains, the agent names itself after its node and stays on
a node gpufleet holds, no Secret holds a real value, every container asks for
resources, and every setting and file path the manifests give is one the code reads.
"""

from __future__ import annotations

import base64
import copy
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpufleet.agent.settings import AgentSettings
from gpufleet.server.routers import probes
from gpufleet.server.settings import ServerSettings

# The oldest Kubernetes the manifests claim to work on: fields newer than it fail here.
KUBERNETES_VERSION = "1.32"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
NAMESPACE = "gpufleet"
# Every value of a Secret the manifests generate contains this, and nothing real does.
PLACEHOLDER = "REPLACE-ME"
# gpufleet's hold taint (schedulers/kubernetes/config.py: HOLD_TAINT_KEY, NoSchedule).
REPAIR_TAINT = ("gpufleet.io/repair", "NoSchedule")

Doc = dict[str, Any]
Rule = tuple[str, str, str]  # (apiGroup, resource, verb)

SERVER_RULES: set[Rule] = {
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "delete"),
    ("", "pods/eviction", "create"),
    ("policy", "poddisruptionbudgets", "get"),
    ("policy", "poddisruptionbudgets", "list"),
}
AGENT_RULES: set[Rule] = {("", "nodes", "get"), ("", "pods", "get"), ("", "pods", "list")}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod"}


def kustomization_dirs() -> list[str]:
    return sorted(str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.yaml"))


@cache
def render(rel: str) -> tuple[Doc, ...]:
    """``kubectl kustomize`` of one directory under deploy/kubernetes, as documents."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail(
            "kubectl is not on PATH: install the `kubectl` package (apt-get install kubectl, "
            "as .ci/run does). Debian's kubernetes-client (kubectl 1.20) is too old: its "
            "kustomize has no components."
        )
    done = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / rel)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {rel} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def kustomization_kind(rel: str) -> str:
    return str(yaml.safe_load((DEPLOY / rel / "kustomization.yaml").read_text())["kind"])


def validation_errors(doc: Doc) -> list[str]:
    """Why ``doc`` is not a valid object of the pinned version; empty if it is. A kind
    the schemas do not know is an error too (a typo'd apiVersion or kind)."""
    name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path)
        return [f"{name}: {where}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [f"{name}: {exc.message}"]
    return []


def find(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    if doc["kind"] == "Pod":
        return dict(doc["spec"])
    if doc["kind"] == "CronJob":
        return dict(doc["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return dict(doc["spec"]["template"]["spec"])


def containers(doc: Doc) -> Iterator[Doc]:
    spec = pod_spec(doc)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def rules(role: Doc) -> set[Rule]:
    out: set[Rule] = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"unexpected keys in {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def tolerates(tolerations: list[Doc], key: str, effect: str) -> bool:
    """Whether a taint ``key`` with ``effect`` and any value is tolerated, by Kubernetes'
    rules: Exists with an empty key matches every key, an empty effect every effect."""
    for tol in tolerations:
        if tol.get("operator", "Equal") != "Exists":
            continue  # Equal matches one value only; gpufleet's taint value is its own
        if tol.get("key", "") in ("", key) and tol.get("effect", "") in ("", effect):
            return True
    return False


def literal_env(container: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# -- every kustomization renders and validates ------------------------------------


def test_the_layout_is_all_found() -> None:
    assert set(kustomization_dirs()) >= {
        "base/server",
        "base/agent",
        "base/postgres",
        "components/agent-privileged",
        "overlays/example",
        "overlays/example-in-cluster-postgres",
    }


@pytest.mark.parametrize("rel", kustomization_dirs())
def test_renders_and_every_object_validates(rel: str) -> None:
    docs = render(rel)
    if kustomization_kind(rel) != "Component":  # a component may only patch
        assert docs, f"{rel} rendered nothing"
    errors = [error for doc in docs for error in validation_errors(doc)]
    assert not errors, f"{rel}, against Kubernetes {KUBERNETES_VERSION}:\n" + "\n".join(errors)


def test_a_typo_fails_validation() -> None:
    """The validator is really on, and strict: a field the API does not have fails."""
    agent = copy.deepcopy(find(render("base/agent"), "DaemonSet", "gpufleet-agent"))
    assert validation_errors(agent) == []
    spec = agent["spec"]["template"]["spec"]
    spec["nodeSelecter"] = spec.pop("nodeSelector")
    assert any("nodeSelecter" in e for e in validation_errors(agent))
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(agent, KUBERNETES_VERSION, strict=True)


def test_a_wrong_type_and_an_unknown_kind_fail_validation() -> None:
    server = copy.deepcopy(find(render("base/server"), "Deployment", "gpufleet-server"))
    server["spec"]["replicas"] = "one"
    assert validation_errors(server)
    assert validation_errors({"apiVersion": "apps/v1", "kind": "Deploymnet", "metadata": {}})


# -- RBAC: exactly what the drivers use ---------------------------------------------


@pytest.mark.parametrize(
    ("rel", "name", "expected"),
    [
        ("base/server", "gpufleet-server", SERVER_RULES),
        ("base/agent", "gpufleet-agent", AGENT_RULES),
    ],
)
def test_cluster_role_is_exactly(rel: str, name: str, expected: set[Rule]) -> None:
    docs = render(rel)
    assert rules(find(docs, "ClusterRole", name)) == expected
    binding = find(docs, "ClusterRoleBinding", name)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": name,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    find(docs, "ServiceAccount", name)
    workload = next(d for d in docs if d["kind"] in WORKLOADS)
    assert pod_spec(workload)["serviceAccountName"] == name
    assert not [d for d in docs if d["kind"] in {"Role", "RoleBinding"}]


# -- the agent ----------------------------------------------------------------------


def test_agent_names_itself_after_its_node_and_stays_on_held_nodes() -> None:
    agent = find(render("base/agent"), "DaemonSet", "gpufleet-agent")
    spec = pod_spec(agent)
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    for name in ("GPUFLEET_AGENT_HOSTNAME", "GPUFLEET_AGENT_KUBERNETES_NODE"):
        assert env[name]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, name
    assert tolerates(spec["tolerations"], *REPAIR_TAINT)
    assert tolerates(spec["tolerations"], "nvidia.com/gpu", "NoSchedule")
    # Exactly these: tolerating everything would also keep it on nodes being drained
    # for reasons of their own (NoExecute), where it should go.
    assert not tolerates(spec["tolerations"], "some.vendor/other", "NoExecute")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    assert agent["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%"},
    }
    assert spec.get("hostPID", False) is False
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}


def test_agent_env_is_real_agent_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GPUFLEET_AGENT_* name is a field (one typo and the agent silently runs on a
    default), and the literal values parse as AgentSettings reads them."""
    (container,) = pod_spec(find(render("base/agent"), "DaemonSet", "gpufleet-agent"))["containers"]
    names = {e["name"] for e in container["env"] if e["name"].startswith("GPUFLEET_AGENT_")}
    fields = {f"GPUFLEET_AGENT_{field.upper()}" for field in AgentSettings.model_fields}
    assert names <= fields, names - fields
    for name, value in literal_env(container).items():
        monkeypatch.setenv(name, value)
    settings = AgentSettings()
    assert settings.kernel_log == "kmsg"
    assert settings.collectors == ("nvml", "kmsg", "infiniband")
    assert settings.server_url == "http://gpufleet-server.gpufleet.svc"
    assert settings.state_dir == Path("/var/lib/gpufleet-agent")


def test_agent_state_dir_is_on_the_host() -> None:
    agent = find(render("base/agent"), "DaemonSet", "gpufleet-agent")
    spec = pod_spec(agent)
    (container,) = spec["containers"]
    state = literal_env(container)["GPUFLEET_AGENT_STATE_DIR"]
    volume = mounted_volume(spec, container, state)
    assert volume["hostPath"] == {"path": state, "type": "DirectoryOrCreate"}
    kmsg = mounted_volume(spec, container, "/dev/kmsg")
    assert kmsg["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert mount_of(container, "/dev/kmsg")["readOnly"] is True


def test_privileged_component_makes_the_agent_privileged() -> None:
    agent = find(render("overlays/example"), "DaemonSet", "gpufleet-agent")
    (container,) = pod_spec(agent)["containers"]
    assert container["securityContext"]["privileged"] is True
    # Everything else the base set stays.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


# -- the server ---------------------------------------------------------------------


def test_server_env_is_real_server_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    (container,) = pod_spec(find(render("base/server"), "Deployment", "gpufleet-server"))[
        "containers"
    ]
    assert container["command"] == ["gpufleet", "server"]
    fields = {f"GPUFLEET_{field.upper()}" for field in ServerSettings.model_fields}
    names = {e["name"] for e in container["env"]}
    assert names <= fields
    for name, value in literal_env(container).items():
        monkeypatch.setenv(name, value)
    settings = ServerSettings()
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)  # noqa: S104 - a pod's address
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.port}


def test_server_probes_hit_the_unauthenticated_probe_routes() -> None:
    (container,) = pod_spec(find(render("base/server"), "Deployment", "gpufleet-server"))[
        "containers"
    ]
    paths = {
        probe: container[probe]["httpGet"]["path"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert paths == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    # The routes the server really serves.
    served = {getattr(route, "path", None) for route in probes.router.routes}
    assert set(paths.values()) <= served


def test_server_runs_restricted() -> None:
    server = find(render("base/server"), "Deployment", "gpufleet-server")
    spec = pod_spec(server)
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    service = find(render("base/server"), "Service", "gpufleet-server")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]


def test_database_is_the_external_url_or_the_in_cluster_postgres() -> None:
    external = render("overlays/example")
    (container,) = pod_spec(find(external, "Deployment", "gpufleet-server"))["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["GPUFLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref["name"].startswith("gpufleet-database") and ref["key"] == "url"
    assert not [d for d in external if d["kind"] == "StatefulSet"]

    in_cluster = render("overlays/example-in-cluster-postgres")
    (container,) = pod_spec(find(in_cluster, "Deployment", "gpufleet-server"))["containers"]
    env = {e["name"]: e for e in container["env"]}
    # The URL names no password (asyncpg takes PGPASSWORD) and no Secret.
    assert env["GPUFLEET_DATABASE_URL"] == {
        "name": "GPUFLEET_DATABASE_URL",
        "value": "postgresql://gpufleet@gpufleet-postgres:5432/gpufleet",
    }
    password = env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]
    postgres = find(in_cluster, "StatefulSet", "gpufleet-postgres")
    (db,) = pod_spec(postgres)["containers"]
    assert db["image"] == "postgres:17"
    db_env = {e["name"]: e for e in db["env"]}
    assert db_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == password
    (claim,) = postgres["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    service = find(in_cluster, "Service", "gpufleet-postgres")
    assert service["spec"]["clusterIP"] == "None"
    assert postgres["spec"]["serviceName"] == "gpufleet-postgres"
    assert not [d for d in in_cluster if d["metadata"]["name"].startswith("gpufleet-database")]


# -- across everything -------------------------------------------------------------


@pytest.mark.parametrize("rel", kustomization_dirs())
def test_no_secret_holds_a_real_value(rel: str) -> None:
    for doc in render(rel):
        if doc["kind"] != "Secret":
            continue
        values = {k: base64.b64decode(v).decode() for k, v in doc.get("data", {}).items()}
        values.update(doc.get("stringData", {}))
        for key, value in values.items():
            assert PLACEHOLDER in value, f"{rel}: Secret {doc['metadata']['name']} {key}"


@pytest.mark.parametrize("rel", kustomization_dirs())
def test_every_container_asks_for_resources(rel: str) -> None:
    for doc in render(rel):
        if doc["kind"] not in WORKLOADS:
            continue
        for container in containers(doc):
            resources = container.get("resources", {})
            where = f"{rel}: {doc['kind']}/{doc['metadata']['name']} {container['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where


@pytest.mark.parametrize("rel", kustomization_dirs())
def test_every_file_setting_is_a_mounted_file(rel: str) -> None:
    """A ``*_FILE`` setting points at a file a volume mount provides (a Secret's item)."""
    for doc in render(rel):
        if doc["kind"] not in WORKLOADS:
            continue
        spec = pod_spec(doc)
        for container in containers(doc):
            for name, value in literal_env(container).items():
                if not name.endswith("_FILE"):
                    continue
                volume = mounted_volume(spec, container, value)
                mount = mount_of(container, value)
                item = str(PurePosixPath(value).relative_to(mount["mountPath"]))
                assert mount.get("readOnly") is True, name
                paths = [i["path"] for i in volume["secret"].get("items", [])]
                assert item in paths, f"{name}={value}: no such item in {volume['name']}"


@pytest.mark.parametrize("rel", ["overlays/example", "overlays/example-in-cluster-postgres"])
def test_overlay_is_complete(rel: str) -> None:
    """An overlay installs as it is: every object in the namespace, every image pinned by
    the overlay, every Secret a pod reads generated with the keys it reads."""
    docs = render(rel)
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert namespace is None, doc["metadata"]["name"]
        else:
            assert namespace == NAMESPACE, f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] not in WORKLOADS:
            continue
        for container in containers(doc):
            image = container["image"]
            tag = image.rsplit("/", 1)[-1]
            assert ("@" in tag or ":" in tag) and not tag.endswith(":latest"), image
        spec = pod_spec(doc)
        for ref in secret_refs(spec):
            name, key = ref
            assert name in secrets, f"{doc['metadata']['name']} reads Secret {name}: missing"
            if key is not None:
                assert key in secrets[name].get("data", {}), f"{name} has no key {key}"


# -- helpers over pod specs ----------------------------------------------------------


def mount_of(container: Doc, path: str) -> Doc:
    """The volume mount ``path`` is in (the deepest one)."""
    target = PurePosixPath(path)
    best: Doc | None = None
    for mount in container.get("volumeMounts", []):
        root = PurePosixPath(mount["mountPath"])
        if (target == root or root in target.parents) and (
            best is None or len(root.parts) > len(PurePosixPath(best["mountPath"]).parts)
        ):
            best = mount
    assert best is not None, f"{container['name']}: nothing is mounted at {path}"
    return best


def mounted_volume(spec: Mapping[str, Any], container: Doc, path: str) -> Doc:
    name = mount_of(container, path)["name"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == name]
    return dict(volume)


def secret_refs(spec: Mapping[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(Secret name, key or None for all of it) for every Secret a pod reads."""
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            items = volume["secret"].get("items")
            if items is None:
                yield volume["secret"]["secretName"], None
            for item in items or []:
                yield volume["secret"]["secretName"], item["key"]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                yield ref["name"], ref["key"]
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                yield source["secretRef"]["name"], None
