"""How every command finds the node it is given: by id, or by name (or hostname, or
scheduler name) within ``--cluster``, within ``--project``'s clusters, or among all the
nodes the caller can see. A name that matches more than one node is refused (exit 2)
with the candidates listed, never guessed."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.errors import CliError
from gpufleet.client.api import MAX_PAGE_SIZE, ApiClient
from gpufleet.core.ids import is_id
from gpufleet.core.models import Node

NODE_HELP = "Node id, or its name (with --cluster where the name is not unique)."
NodeArg = Annotated[str, typer.Argument(help=NODE_HELP)]

# Candidates an ambiguous name lists before it says "and N more".
_SHOWN = 8


def find_node(client: ApiClient, ref: str, *, cluster: str | None, project: str | None) -> Node:
    """The node ``ref`` names, with its GPUs.

    ``cluster`` (an id or name) and ``project`` narrow where a name is looked for; an id
    is fetched as it is. Raises ``CliError`` (exit 2) for an empty ref, a name no visible
    node has, and one several have; ``ApiError`` for an unknown id or cluster.
    """
    ref = ref.strip()
    if not ref:
        raise CliError("the node is empty: give its name or id")
    if is_id(ref):
        return client.get_node(ref)
    if cluster is not None:
        cluster_id = client.find_cluster(cluster, project=project).id
        nodes = list(client.iter_nodes(cluster=cluster_id))
        where = f" in cluster {cluster!r}"
    elif project is not None:
        clusters = client.list_clusters(project=project, limit=MAX_PAGE_SIZE).items
        ids = {c.id for c in clusters}
        nodes = [n for n in client.iter_nodes() if n.cluster_id in ids]
        where = f" in project {project!r}"
    else:
        nodes = list(client.iter_nodes())
        where = ""
    # A name is what tables show; a hostname or Slurm's name is what a person may have
    # from a log. The name wins, so a node named like another's hostname is still found.
    found = [n for n in nodes if n.name == ref] or [
        n for n in nodes if ref in (n.hostname, n.scheduler_name)
    ]
    if not found:
        raise CliError(
            f"no node named {ref!r}{where}; `gpufleet nodes list` shows the names and ids"
        )
    if len(found) > 1:
        raise CliError(_ambiguous(client, ref, found, where=where))
    return client.get_node(found[0].id)


def _ambiguous(client: ApiClient, ref: str, found: list[Node], *, where: str) -> str:
    cluster_names = {c.id: c.name for c in client.list_clusters(limit=MAX_PAGE_SIZE).items}
    listed = [
        f"{n.name} in cluster {cluster_names.get(n.cluster_id, n.cluster_id)} ({n.id})"
        for n in found[:_SHOWN]
    ]
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    return (
        f"{len(found)} nodes are named {ref!r}{where}: {'; '.join(listed)}{more}. "
        "Pass --cluster, or the node id"
    )
