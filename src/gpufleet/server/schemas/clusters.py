from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, StrictBool, StringConstraints

from gpufleet.core.acceptance import AcceptanceSuite
from gpufleet.core.enums import ProviderKind, SchedulerKind
from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL
from gpufleet.core.stacks import STACK_NAME
from gpufleet.schedulers.kubernetes.config import MAX_KUBECONFIG_BYTES
from gpufleet.server.schemas.common import Name, Ref, Request

MAX_CLUSTER_SIZE = 4096
LabelKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./-]{1,63}$")]
LabelValue = Annotated[str, StringConstraints(max_length=255)]
# A host-name start: nodes are <prefix><index, 3 digits>, e.g. "gpu-" → gpu-001, gpu-002.
NodePrefix = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,59}$")]
# Shell scripts run in order on every node start, each under /bin/sh -c.
StartupScripts = Annotated[
    list[Annotated[str, StringConstraints(min_length=1, max_length=65536)]], Field(max_length=32)
]
AutoscaleMin = Annotated[int, Field(ge=0, le=MAX_CLUSTER_SIZE, strict=True)]
AutoscaleMax = Annotated[int, Field(ge=1, le=MAX_CLUSTER_SIZE, strict=True)]


Kubeconfig = Annotated[SecretStr, Field(min_length=1, max_length=MAX_KUBECONFIG_BYTES)]

# Checked against the cluster's provider by the service (a 422 names the field), since
# which fields exist depends on the provider, not on the body.
ProviderConfigBody = Annotated[dict[str, Any], Field(max_length=64)]


class CreateClusterRequest(Request):
    project: Ref
    name: Name
    scheduler: SchedulerKind = SchedulerKind.SIM
    provider: ProviderKind = ProviderKind.SIM
    gpu_model: Annotated[str, Field(min_length=1, max_length=120)] = DEFAULT_GPU_MODEL
    gpus_per_node: Annotated[int, Field(ge=0, le=64, strict=True)] = 8
    size: Annotated[int, Field(ge=1, le=MAX_CLUSTER_SIZE, strict=True)]
    acceptance_tests: StrictBool = True
    # None: the default suite (dcgm diag level 3, NCCL per node and across the cluster,
    # ib_write_bw per HCA).
    acceptance_suite: AcceptanceSuite | None = None
    startup_scripts: StartupScripts = []
    autoscale_min: AutoscaleMin | None = None
    autoscale_max: AutoscaleMax | None = None
    labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=64)] = {}
    # Node names: <node_prefix><first_node_index + slot, 3 digits>. The default prefix is
    # "<name>-" from 000; set them to match machines already named (Slurm's gpu-001...).
    node_prefix: NodePrefix | None = None
    first_node_index: Annotated[int, Field(ge=0, le=99_999, strict=True)] = 0
    # What the provider needs per cluster, checked against ``provider``
    # (core/providers.py): for aws the region, the credential's name and the placement;
    # nothing for the others.
    provider_config: ProviderConfigBody = {}
    # scheduler kubernetes only, one of the two (services/kube_clusters.py): the
    # kubeconfig file's text (stored sealed as a credential; SecretStr, so neither a
    # validation error nor a repr shows it) with an optional context (default: its
    # current-context), or the server's own pod's service account.
    kubeconfig: Kubeconfig | None = None
    kube_context: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = None
    kube_in_cluster: StrictBool = False
    # Slurm runs on its nodes under Slinky: holds drain in Slurm first (the server's
    # Slurm driver, GPUFLEET_SLURM_CONF / slurm_rest_url).
    kube_slurm: StrictBool = False
    # The software stack its nodes run (``gpufleet stacks list``); None: the latest.
    stack: Annotated[str, Field(pattern=STACK_NAME)] | None = None


class SetProviderConfigRequest(Request):
    """PUT: the whole configuration (fields left out take their defaults)."""

    config: ProviderConfigBody
    reason: Annotated[str, Field(max_length=1000)] = ""


class UpdateClusterRequest(Request):
    """PATCH: only the fields given change. ``acceptance_suite: null`` resets the suite to
    the default; ``autoscale_min``/``autoscale_max`` null removes that bound."""

    acceptance_tests: StrictBool | None = None
    acceptance_suite: AcceptanceSuite | None = None
    startup_scripts: StartupScripts | None = None
    autoscale_min: AutoscaleMin | None = None
    autoscale_max: AutoscaleMax | None = None
    reason: Annotated[str, Field(max_length=1000)] = ""
