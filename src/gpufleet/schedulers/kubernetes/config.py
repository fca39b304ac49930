"""Settings of the Kubernetes scheduler driver, and the checks of a kubeconfig that need no
network (which context, which server, which user), so a bad file is refused with what
is wrong before anything is stored or dialled."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The resource name of NVIDIA's device plugin (``nvidia.com/gpu``) in capacity,
# allocatable and container requests.
GPU_RESOURCE = "nvidia.com/gpu"
# gpufleet's marks on a node it holds: an annotation with the hold's reason (what makes a
# cordon gpufleet's to undo), a NoSchedule taint and a node condition.
ANNOTATION_PREFIX = "gpufleet.io/"
HOLD_ANNOTATION = f"{ANNOTATION_PREFIX}hold"
HOLD_TAINT_KEY = f"{ANNOTATION_PREFIX}repair"
# On a Slurm-on-Kubernetes node: the Slurm node gpufleet drained for this hold, kept so
# the release resumes it even after its slurmd pod has gone.
SLURM_NODE_ANNOTATION = f"{ANNOTATION_PREFIX}slurm-node"
HEALTH_CONDITION = "GpuHealthy"
# Where the pod's service account is mounted (in-cluster credentials).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# A kubeconfig is a small YAML file; one over this is not one.
MAX_KUBECONFIG_BYTES = 1_000_000


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """How gpufleet reaches one Kubernetes cluster's API server.

    Either ``kubeconfig`` (the file's text: it holds a credential, so it is never logged
    or shown) with an optional ``context``, or ``in_cluster`` (the server runs in that
    cluster: the pod's service account token and CA, ``KUBERNETES_SERVICE_HOST``).
    """

    kubeconfig: str | None = None
    context: str | None = None  # None: the kubeconfig's current-context
    in_cluster: bool = False
    # Seconds one API request may take before the call fails (DriverError).
    timeout_s: float = 30.0
    # Namespaces whose pods are never evicted (the cluster's own machinery).
    protected_namespaces: tuple[str, ...] = ("kube-system",)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.in_cluster == (self.kubeconfig is not None):
            raise ValueError("give a kubeconfig or in-cluster credentials (one of the two)")
        if self.kubeconfig is not None:
            check_kubeconfig(self.kubeconfig, context=self.context)

    def __repr__(self) -> str:  # the kubeconfig holds a credential
        return (
            f"KubernetesConfig(context={self.context!r}, in_cluster={self.in_cluster}, "
            f"kubeconfig={'<set>' if self.kubeconfig else None})"
        )


@dataclass(frozen=True, slots=True)
class KubeconfigTarget:
    """What a kubeconfig points at (nothing secret)."""

    context: str
    server: str
    user: str


def load_kubeconfig(text: str) -> dict[str, Any]:
    """The kubeconfig's document. Raises ``ValueError`` saying what is wrong, never
    quoting the file (it holds a credential)."""
    import yaml  # type: ignore[import-untyped]  # the server extra

    if len(text.encode()) > MAX_KUBECONFIG_BYTES:
        raise ValueError(f"the kubeconfig is over {MAX_KUBECONFIG_BYTES} bytes; it is not one")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"the kubeconfig is not YAML{where}") from None
    if not isinstance(doc, dict):
        raise ValueError("the kubeconfig is not a YAML mapping (kind: Config)")
    kind = doc.get("kind")
    if kind is not None and kind != "Config":
        raise ValueError(f"the kubeconfig's kind is {kind!r}, not Config")
    return doc


def check_kubeconfig(text: str, *, context: str | None) -> KubeconfigTarget:
    """The context, server and user a kubeconfig would use. Raises ``ValueError`` naming
    the missing or unknown piece (a context, cluster or user by name; never a secret)."""
    doc = load_kubeconfig(text)
    contexts = _named(doc, "contexts", "context")
    clusters = _named(doc, "clusters", "cluster")
    users = _named(doc, "users", "user")
    chosen = context or doc.get("current-context")
    if not chosen:
        names = ", ".join(sorted(contexts)) or "none"
        raise ValueError(f"the kubeconfig has no current-context; name one (contexts: {names})")
    if chosen not in contexts:
        names = ", ".join(sorted(contexts)) or "none"
        raise ValueError(f"the kubeconfig has no context {chosen!r} (contexts: {names})")
    ctx = contexts[chosen]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if not isinstance(cluster_name, str) or cluster_name not in clusters:
        raise ValueError(f"context {chosen!r} names cluster {cluster_name!r}, which is not listed")
    server = clusters[cluster_name].get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise ValueError(f"cluster {cluster_name!r} has no http(s) server URL")
    if not isinstance(user_name, str) or user_name not in users:
        raise ValueError(f"context {chosen!r} names user {user_name!r}, which is not listed")
    return KubeconfigTarget(context=chosen, server=server, user=user_name)


def _named(doc: Mapping[str, Any], key: str, inner: str) -> dict[str, dict[str, Any]]:
    entries = doc.get(key) or []
    if not isinstance(entries, list):
        raise ValueError(f"the kubeconfig's {key} is not a list")
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"an entry of the kubeconfig's {key} has no name")
        body = entry.get(inner)
        out[entry["name"]] = body if isinstance(body, dict) else {}
    return out
