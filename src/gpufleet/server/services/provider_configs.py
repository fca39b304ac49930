"""A cluster's provider configuration: what its provider needs per cluster (for ``aws``
the region, the account's credential by name, and the placement), checked against the
store. Shown and changed in ``cluster_provider_config.py``; used by ``aws_providers.py``.

The configuration never holds a secret: an AWS key is a stored credential of the project
(``services/credentials.py``), named here and opened only when a driver call needs it
(``services/aws_providers.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ProviderKind
from gpufleet.core.errors import InvalidInput
from gpufleet.core.inventory import CredentialKind
from gpufleet.core.providers import AwsProviderConfig, ProviderConfig, parse_provider_config
from gpufleet.server.db.tables import ClusterRow
from gpufleet.server.services.credentials import find_credential_row


async def check_provider_config(
    session: AsyncSession, *, project_id: str, kind: ProviderKind, raw: Mapping[str, object]
) -> ProviderConfig:
    """``raw`` as the configuration of a cluster of ``project_id`` on ``kind``, its
    credential a stored ``aws_key`` of that project (the config then names it by name).

    Raises:
        InvalidInput: a bad or unknown field, or a credential that is missing or of
            another kind (field ``provider_config.<name>``).
    """
    config = parse_provider_config(kind, raw)
    if not isinstance(config, AwsProviderConfig):
        return config
    row = await find_credential_row(session, project_id=project_id, ref=config.credential)
    if row is None:
        raise InvalidInput(
            f"provider_config.credential: no credential {config.credential!r} in this "
            "project; store the access key first (`gpufleet credentials put NAME --kind "
            "aws_key`)",
            field="provider_config.credential",
        )
    if row.kind != CredentialKind.AWS_KEY.value:
        raise InvalidInput(
            f"provider_config.credential: credential {row.name!r} is a {row.kind}, not an aws_key",
            field="provider_config.credential",
        )
    return config.model_copy(update={"credential": row.name})


def stored_provider_config(row: ClusterRow) -> ProviderConfig | None:
    """The cluster's stored configuration, or None when it no longer reads as its
    provider's (never written so by this server; a hand edit of the store)."""
    try:
        return parse_provider_config(ProviderKind(row.provider), row.provider_config or {})
    except InvalidInput:
        return None
