"""``gpufleet login``: check a token against the server and save it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.output import OutputFormat, OutputOpt, fields, print_json, print_table


def login(
    url: Annotated[str, typer.Option("--url", help="Server URL, e.g. http://gpufleet:8080.")],
    token: Annotated[
        str,
        typer.Option(
            "--token",
            prompt="API token",
            hide_input=True,
            help="API token (prompted without echo when left out).",
        ),
    ],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Verify the token by asking the server who it belongs to, then save it (mode 0600)."""
    creds = config.Credentials(url=url.rstrip("/"), token=token.strip())
    with config.make_client(creds) as client:
        me = client.me()
        projects = {p.id: p.name for p in client.list_projects(limit=1000).items}
    path = config.save_credentials(creds)
    if output is OutputFormat.JSON:
        print_json(me)
        return
    who = me.user.name + (f" <{me.user.email}>" if me.user.email else "")
    roles = Text()
    for i, m in enumerate(me.memberships):
        if i:
            roles.append(", ")
        roles.append(f"{projects.get(m.project_id, m.project_id)} ({m.role.value})")
    rows: list[tuple[str, Text | str]] = [
        ("logged in as", who + (" (owner)" if me.user.is_owner else "")),
        ("server", creds.url),
        ("projects", roles if me.memberships else Text("none yet", style="dim")),
        ("saved to", str(path)),
    ]
    print_table(fields(rows))
