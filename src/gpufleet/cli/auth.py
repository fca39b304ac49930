"""``gpufleet login``: check a token against the server and save it.

``--oidc`` gets the token through the organisation's IdP instead: the device
authorization grant (a code to approve in any browser), then the server trades the ID
token for a personal API token.
"""

from __future__ import annotations

import socket
from typing import Annotated

import httpx
import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.cli.output import OutputFormat, OutputOpt, fields, print_json, print_table
from gpufleet.client.oidc import DeviceLoginError, start_device_authorization, wait_for_id_token
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import Role

NO_DEVICE_FLOW = (
    "log in with a personal API token instead: create one in the console or with "
    "`gpufleet tokens create`, then run `gpufleet login --url URL --token TOKEN`"
)


def _token_by_device_flow(url: str, *, project: str | None, role: Role | None) -> str:
    with config.make_client(config.Credentials(url=url, token="")) as anonymous:
        cfg = anonymous.auth_config()
        if not cfg.oidc or not cfg.cli_client_id or not cfg.token_endpoint:
            raise CliError(f"{url} has no OIDC login; {NO_DEVICE_FLOW}")
        if not cfg.device_authorization_endpoint:
            raise CliError(
                f"the identity provider {cfg.issuer} offers no device login; {NO_DEVICE_FLOW}"
            )
        try:
            with httpx.Client(timeout=30.0, headers={"Accept": "application/json"}) as http:
                authorization = start_device_authorization(
                    http,
                    endpoint=cfg.device_authorization_endpoint,
                    client_id=cfg.cli_client_id,
                    scopes=cfg.scopes or "openid",
                )
                where = authorization.verification_uri_complete or authorization.verification_uri
                typer.echo(
                    f"To log in, open {where}\nand confirm the code {authorization.user_code}"
                    " (waiting for the browser…)",
                    err=True,
                )
                id_token = wait_for_id_token(
                    http,
                    token_endpoint=cfg.token_endpoint,
                    client_id=cfg.cli_client_id,
                    authorization=authorization,
                )
        except DeviceLoginError as exc:
            raise CliError(str(exc)) from exc
        created = anonymous.create_device_token(
            id_token=id_token,
            name=f"cli {socket.gethostname()} {utcnow():%Y-%m-%d}",
            project=project,
            role=role,
        )
    return created.token


def login(
    url: Annotated[str, typer.Option("--url", help="Server URL, e.g. http://gpufleet:8080.")],
    token: Annotated[
        str | None,
        typer.Option("--token", help="API token (prompted without echo when left out)."),
    ] = None,
    oidc: Annotated[
        bool,
        typer.Option(
            "--oidc", help="Log in through your organisation's identity provider (device code)."
        ),
    ] = False,
    project: Annotated[
        str | None,
        typer.Option(help="With --oidc: the project the token is for (default: your only one)."),
    ] = None,
    role: Annotated[
        Role | None,
        typer.Option(case_sensitive=False, help="With --oidc: the most the token may do."),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Verify the token by asking the server who it belongs to, then save it (mode 0600)."""
    url = url.rstrip("/")
    if oidc:
        if token is not None:
            raise CliError("give either --token or --oidc, not both")
        token = _token_by_device_flow(url, project=project, role=role)
    elif token is None:
        token = typer.prompt("API token", hide_input=True)
    creds = config.Credentials(url=url, token=token.strip())
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
