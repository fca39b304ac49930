"""A kubernetes cluster's credentials at its creation: which fields a request may carry,
the kubeconfig's own checks, its API server's answer, and the sealed credential.

The order matters (``services.clusters.create_cluster`` and the route): everything that
needs no network is checked first, then the API server is asked for its version (``GET
/version``, at most ``REACH_TIMEOUT_S``) outside any transaction, then the credential
and the cluster are written in one transaction. A kubeconfig that is not one, names an
unknown context or user, or whose server does not answer or refuses it, is a 422 saying
so (its server named, never its secret), and nothing is written.

The kubeconfig is stored as a credential of kind ``kubeconfig`` named
``kubeconfig-<cluster id>`` in the cluster's project; the cluster's scheduler
configuration names it by id, with the context and server it points at.

In-cluster credentials (``kube_in_cluster``) are the gpufleet server's own pod's service
account: nothing is stored, and ``KubernetesConfig(in_cluster=True)`` is the only reader
of ``KUBERNETES_SERVICE_HOST`` and the service-account files.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import SchedulerKind
from gpufleet.core.errors import Conflict, DriverError, InvalidInput
from gpufleet.core.ids import new_id
from gpufleet.core.inventory import CredentialKind
from gpufleet.core.models import SchedulerConfig
from gpufleet.schedulers.kubernetes.config import (
    KubernetesConfig,
    check_kubeconfig,
    load_kubeconfig,
)
from gpufleet.server.db.tables import CredentialRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.schemas.clusters import CreateClusterRequest
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.keyring import NO_KEY_MESSAGE, Keyring, credential_aad
from gpufleet.server.services.kube_schedulers import KubeSchedulers

# Seconds the reach check at creation waits for the API server: long enough for a
# distant control plane, short enough for a person waiting on a create.
REACH_TIMEOUT_S = 10.0
_KUBE_FIELDS = ("kubeconfig", "kube_context", "kube_in_cluster", "kube_slurm")
# Fields of a kubeconfig's user entry that are credentials, scrubbed from any message.
_SECRET_USER_FIELDS = ("token", "password", "client-key-data", "client-certificate-data")


def kubeconfig_credential_name(cluster_id: str) -> str:
    """The name of the credential that holds a cluster's kubeconfig."""
    return f"kubeconfig-{cluster_id}"


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """A kubernetes cluster's credentials, checked and answered by its API server: what
    ``store_kube_access`` writes. ``kubeconfig`` is None in-cluster."""

    kubeconfig: str | None = field(repr=False)
    context: str | None
    server: str | None
    in_cluster: bool
    version: str  # the API server's gitVersion, as it answered
    slurm: bool = False  # Slurm on its nodes (Slinky), through the server's Slurm driver


def check_kube_fields(request: CreateClusterRequest) -> None:
    """The kubernetes fields: refused for the other schedulers; for kubernetes, a
    kubeconfig (with an optional context) or in-cluster credentials, one of the two.
    Raises ``InvalidInput`` naming the field."""
    given = [
        name
        for name in _KUBE_FIELDS
        if getattr(request, name) is not None and getattr(request, name) is not False
    ]
    if request.scheduler is not SchedulerKind.KUBERNETES:
        if given:
            raise InvalidInput(
                f"{given[0]}: only a kubernetes cluster takes {', '.join(_KUBE_FIELDS)} "
                f"(this one's scheduler is {request.scheduler.value})",
                field=given[0],
            )
        return
    if request.kube_in_cluster and request.kubeconfig is not None:
        raise InvalidInput(
            "kube_in_cluster: give a kubeconfig or kube_in_cluster: true, not both",
            field="kube_in_cluster",
        )
    if request.kube_in_cluster and request.kube_context is not None:
        raise InvalidInput(
            "kube_context: picks a context of the kubeconfig; in-cluster credentials have none",
            field="kube_context",
        )
    if not request.kube_in_cluster and request.kubeconfig is None:
        raise InvalidInput(
            "kubeconfig: a kubernetes cluster needs its API server's credentials: kubeconfig "
            "(the file's text; kube_context picks a context, default its current-context) "
            "or kube_in_cluster: true (the server's own pod's service account)",
            field="kubeconfig",
        )


async def reach_kube_api(
    request: CreateClusterRequest, *, drivers: DriverRegistry, keyring: Keyring
) -> KubeAccess:
    """Check the request's kubeconfig without the network, then ask its API server for
    its version. Call outside any transaction (it waits on the network).

    Raises:
        InvalidInput: a bad kubeconfig (what is wrong), an API server that does not
            answer, refuses the credential or times out (its URL and why).
        Conflict: a kubeconfig but no secret key to seal it with.
    """
    check_kube_fields(request)
    if request.kube_slurm and SchedulerKind.SLURM.value not in drivers.schedulers:
        raise InvalidInput(
            "kube_slurm: this server has no Slurm driver to drain the Slurm side with; set "
            "GPUFLEET_SLURM_CONF (or GPUFLEET_SLURM_REST_URL) for that Slurm cluster",
            field="kube_slurm",
        )
    schedulers = drivers.per_cluster_schedulers.get(SchedulerKind.KUBERNETES.value)
    if not isinstance(schedulers, KubeSchedulers):
        drivers.check_scheduler(SchedulerKind.KUBERNETES.value)  # names what is configured
        raise InvalidInput("scheduler 'kubernetes' is not configured on this server",
                           field="scheduler")  # fmt: skip
    if request.kube_in_cluster:
        config = KubernetesConfig(in_cluster=True, timeout_s=REACH_TIMEOUT_S)
        version = await _reach(
            schedulers, config, server="the in-cluster API server", field_name="kube_in_cluster",
            secrets=(),
            hint=" (in-cluster credentials work only when the gpufleet server runs in a "
            "pod of that cluster; else give its kubeconfig)",
        )  # fmt: skip
        return KubeAccess(
            kubeconfig=None, context=None, server=None, in_cluster=True, version=version,
            slurm=request.kube_slurm,
        )  # fmt: skip
    assert request.kubeconfig is not None  # check_kube_fields
    if not keyring.configured:
        raise Conflict(NO_KEY_MESSAGE, field="kubeconfig")
    text = request.kubeconfig.get_secret_value()
    try:
        target = check_kubeconfig(text, context=request.kube_context)
    except ValueError as exc:
        wrong_context = request.kube_context is not None and (
            f"no context {request.kube_context!r}" in str(exc)
        )
        name = "kube_context" if wrong_context else "kubeconfig"
        raise InvalidInput(f"{name}: {exc}", field=name) from None
    # The context resolved now is the one kept: a kubeconfig replaced later with another
    # current-context does not move the cluster to another API server unseen.
    config = KubernetesConfig(kubeconfig=text, context=target.context, timeout_s=REACH_TIMEOUT_S)
    version = await _reach(
        schedulers, config, server=target.server, field_name="kubeconfig",
        secrets=_user_secrets(text, target.user), hint="",
    )  # fmt: skip
    return KubeAccess(
        kubeconfig=text,
        context=target.context,
        server=target.server,
        in_cluster=False,
        version=version,
        slurm=request.kube_slurm,
    )


async def _reach(
    schedulers: KubeSchedulers,
    config: KubernetesConfig,
    *,
    server: str,
    field_name: str,
    secrets: tuple[str, ...],
    hint: str,
) -> str:
    try:
        return await schedulers.reach(config)
    except (DriverError, ValueError) as exc:
        reason = exc.message if isinstance(exc, DriverError) else str(exc)
        # The driver's words name the request and the server; this message names both.
        for said in ("kubernetes: ", "GET /version: ", f"cannot reach {server}: "):
            reason = reason.removeprefix(said)
        for secret in secrets:  # the driver names none; this makes sure of it
            reason = reason.replace(secret, "<redacted>")
        raise InvalidInput(
            f"cannot reach the Kubernetes API at {server}: {reason}{hint}; nothing was stored",
            field=field_name,
        ) from None


def _user_secrets(text: str, user: str) -> tuple[str, ...]:
    try:
        doc = load_kubeconfig(text)
    except ValueError:
        return ()
    found: list[str] = []
    for entry in doc.get("users") or []:
        body: Any = entry.get("user") if isinstance(entry, dict) else None
        if isinstance(entry, dict) and entry.get("name") == user and isinstance(body, dict):
            found += [str(body[k]) for k in _SECRET_USER_FIELDS if body.get(k)]
    return tuple(s for s in found if len(s) >= 4)


def store_kube_access(
    session: AsyncSession,
    *,
    access: KubeAccess,
    cluster_id: str,
    project_id: str,
    caller: Caller,
    keyring: Keyring,
    now: dt.datetime,
) -> SchedulerConfig:
    """Seal the kubeconfig as the cluster's credential (in the caller's transaction, with
    the cluster) and answer the cluster's scheduler configuration."""
    if access.in_cluster:
        return SchedulerConfig(in_cluster=True, slurm=access.slurm)
    assert access.kubeconfig is not None
    row = CredentialRow(
        id=new_id(),
        project_id=project_id,
        name=kubeconfig_credential_name(cluster_id),
        kind=CredentialKind.KUBECONFIG.value,
        username=None,
        created_by=caller.actor,
        created_at=now,
        rotated_at=None,
    )
    row.key_id, row.ciphertext = keyring.seal(access.kubeconfig, aad=credential_aad(row.id))
    session.add(row)
    record_audit(
        session,
        actor=caller.actor,
        action="credential.create",
        object_type="credential",
        object_id=row.id,
        project_id=project_id,
        source_ip=caller.source_ip,
        detail={
            "name": row.name, "kind": row.kind, "username": None, "key_id": row.key_id,
            "cluster_id": cluster_id,
        },
        ts=now,
    )  # fmt: skip
    return SchedulerConfig(
        credential_id=row.id,
        context=access.context,
        server=access.server,
        in_cluster=False,
        slurm=access.slurm,
    )


def audited_request(
    request: CreateClusterRequest, scheduler_config: SchedulerConfig | None
) -> dict[str, object]:
    """A create request as its audit row keeps it: scripts left out (they may hold site
    details); for kubernetes the kubeconfig too (sealed as a credential, audited on its
    own), the scheduler configuration that names it instead."""
    if scheduler_config is None:
        return request.model_dump(mode="json", exclude={"startup_scripts", *_KUBE_FIELDS})
    return {
        **request.model_dump(mode="json", exclude={"startup_scripts", "kubeconfig"}),
        "scheduler_config": scheduler_config.model_dump(mode="json"),
    }


def describe_kube_access(kube: KubeAccess) -> str:
    """What the cluster's creation event says of its API server."""
    if kube.in_cluster:
        return f"in-cluster credentials, Kubernetes {kube.version}"
    return f"context {kube.context} at {kube.server}, Kubernetes {kube.version}"
