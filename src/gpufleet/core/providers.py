"""What ``gpufleet providers check`` returns, as the API, the client and the CLI see it.

A reach check reaches each host's management path (BMC, SSH) through the cluster's
provider and reports what it saw, changing nothing. Nothing here ever holds a secret: a
row's ``detail`` is the driver's own scrubbed text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from gpufleet.core.enums import ProviderKind
from gpufleet.core.errors import InvalidInput

# The provider's view of a machine's power (providers.base.PowerState's values); SSH
# cannot see power, so its hosts are "on" when they answer, else "unknown".
Power = Literal["on", "off", "unknown"]


class _Domain(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


class HostReach(_Domain):
    """One host of the inventory as its provider's reach check saw it."""

    hostname: str
    host_id: str
    reachable: bool
    power: Power
    detail: str  # what was seen, or what failed (never a secret)


class ProvidersCheckResult(_Domain):
    cluster_id: str
    provider: ProviderKind  # whose ``check_reach`` ran: the cluster's, or the one asked for
    hosts: list[HostReach]  # by hostname

    @property
    def all_reachable(self) -> bool:
        return all(h.reachable for h in self.hosts)


# -- per-cluster provider configuration ---------------------------------------------------

# AWS names: what the console and API accept, bounded so a typo cannot store a novel.
_AwsName = Annotated[str, StringConstraints(min_length=1, max_length=255)]
_TagKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
_TagValue = Annotated[str, StringConstraints(max_length=256)]
# Tags gpufleet sets itself (providers/aws/config.py RESERVED_TAG_PREFIXES); AWS owns aws:.
# Built from the namespace, as there: a literal "gpufleet:..." in src/ reads as a drain
# reason to tests/server/test_lifecycle_owners.py, and these are tag keys.
_TAG_NAMESPACE = "gpufleet"
_RESERVED_TAG_PREFIXES = (f"{_TAG_NAMESPACE}:", "aws:")


class _Config(BaseModel):
    # Unknown fields are an error, never silently dropped: a misspelt subnet_id would
    # otherwise launch into the template's network.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class NoProviderConfig(_Config):
    """sim, static, ipmi, redfish and ssh: nothing per cluster (bare-metal machines come
    from the host inventory, each host with its own credential)."""


class AwsProviderConfig(_Config):
    """Where an ``aws`` cluster's machines come from, and with which account.

    ``credential`` is the *name* of a stored credential of the cluster's project, of kind
    ``aws_key``: never a key itself. It is required: without it boto3 would use the
    server's own identity (instance profile, environment), which is not a project's to use.
    The rest is the driver's ``AwsPlacement`` (docs/providers-aws.md).
    """

    region: Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")]
    # A VPC interface endpoint (or moto in tests); None: the public regional endpoint.
    endpoint_url: Annotated[str, StringConstraints(pattern=r"^https?://\S+$")] | None = None
    credential: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    auto_scaling_group: _AwsName | None = None
    launch_template_id: Annotated[str, StringConstraints(pattern=r"^lt-[0-9a-f]+$")] | None = None
    launch_template_name: _AwsName | None = None
    # "$Default", "$Latest" or a number; $Default: the version an operator promoted.
    launch_template_version: Annotated[
        str, StringConstraints(pattern=r"^(\$Default|\$Latest|[1-9]\d{0,8})$")
    ] = "$Default"
    instance_type: _AwsName | None = None
    subnet_id: Annotated[str, StringConstraints(pattern=r"^subnet-[0-9a-f]+$")] | None = None
    tags: Annotated[dict[_TagKey, _TagValue], Field(max_length=40)] = {}


ProviderConfig = AwsProviderConfig | NoProviderConfig


class ClusterProviderConfig(_Domain):
    """A cluster's provider and its configuration, as ``GET .../provider-config`` shows it
    (a credential by name only)."""

    cluster_id: str
    cluster_name: str
    provider: ProviderKind
    config: AwsProviderConfig | NoProviderConfig


def parse_provider_config(kind: ProviderKind, raw: Mapping[str, object]) -> ProviderConfig:
    """``raw`` as the configuration of a cluster on provider ``kind``.

    Raises:
        InvalidInput: a field the provider does not take, a missing or bad one; the
            error's field is ``provider_config.<name>``.
    """
    model: type[ProviderConfig] = (
        AwsProviderConfig if kind is ProviderKind.AWS else NoProviderConfig
    )
    try:
        config = model.model_validate(dict(raw))
    except ValidationError as exc:
        raise _invalid(kind, exc) from None
    if isinstance(config, AwsProviderConfig):
        _check_placement(config)
    return config


def _check_placement(config: AwsProviderConfig) -> None:
    # The driver's AwsPlacement rules, said here so the 422 names the field.
    if config.launch_template_id is not None and config.launch_template_name is not None:
        raise InvalidInput(
            "provider_config.launch_template_id: set launch_template_id or "
            "launch_template_name, not both",
            field="provider_config.launch_template_id",
        )
    if (
        config.auto_scaling_group is None
        and config.launch_template_id is None
        and config.launch_template_name is None
    ):
        raise InvalidInput(
            "provider_config.auto_scaling_group: an aws cluster needs auto_scaling_group, a "
            "launch template (launch_template_id or launch_template_name), or both",
            field="provider_config.auto_scaling_group",
        )
    for key in config.tags:
        if key.startswith(_RESERVED_TAG_PREFIXES):
            raise InvalidInput(
                f"provider_config.tags: {key!r}: gpufleet: and aws: tags are set by "
                "gpufleet and AWS, not by a cluster",
                field=f"provider_config.tags.{key}",
            )


def _invalid(kind: ProviderKind, exc: ValidationError) -> InvalidInput:
    messages: list[str] = []
    first: str | None = None
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        field = f"provider_config.{loc}" if loc else "provider_config"
        first = first or field
        kind_of = err.get("type", "")
        if kind_of == "extra_forbidden":
            takes = (
                ", ".join(AwsProviderConfig.model_fields) if kind is ProviderKind.AWS else "nothing"
            )
            messages.append(f"{field}: unknown field (provider {kind.value} takes: {takes})")
        elif kind_of == "missing":
            messages.append(f"{field}: field required")
        elif loc == "region":
            messages.append(f"{field}: not an AWS region name, e.g. us-east-1")
        else:
            messages.append(f"{field}: {err.get('msg', 'invalid value')}")
    return InvalidInput("; ".join(messages), field=first)
