"""Where credentials live, and how the CLI builds its API client.

Credentials are ``{"url", "token"}`` in ``$XDG_CONFIG_HOME/gpufleet/credentials.json``
(default ``~/.config/gpufleet``), readable by the owner only. ``GPUFLEET_URL`` and
``GPUFLEET_TOKEN`` (or ``--url``/``--token``) override what is saved.

A URL may be several, comma-separated: the replicas of one server
(docs/high-availability.md). The client asks the one that answered last and moves to
the next when it is down.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from pydantic import BaseModel, ConfigDict, ValidationError

from gpufleet.cli.env import ENV_TOKEN as ENV_TOKEN
from gpufleet.cli.env import ENV_URL as ENV_URL
from gpufleet.cli.env import GlobalOptions as GlobalOptions
from gpufleet.cli.errors import CliError
from gpufleet.client.api import ApiClient
from gpufleet.client.http import parse_server_urls

FILE_MODE = 0o600
DIR_MODE = 0o700


class Credentials(BaseModel):
    model_config = ConfigDict(frozen=True)

    url: str
    token: str


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpufleet"


def credentials_path() -> Path:
    return config_dir() / "credentials.json"


def load_credentials(path: Path | None = None) -> Credentials | None:
    """The saved credentials, or None when nobody has logged in on this account."""
    path = path or credentials_path()
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return Credentials.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise CliError(
            f"{path} is not a valid credentials file ({exc.__class__.__name__}); "
            "run `gpufleet login` again"
        ) from exc


def save_credentials(creds: Credentials, path: Path | None = None) -> Path:
    """Write the credentials, owner-only (dir 0700, file 0600), replacing the old file.

    The file is created with mode 0600 from the start, so the token is never readable by
    others even for a moment, and renamed into place so a crash never leaves half a file.
    """
    path = path or credentials_path()
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    path.parent.chmod(DIR_MODE)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(creds.model_dump_json(indent=2) + "\n")
        os.chmod(tmp, FILE_MODE)  # O_CREAT's mode is masked by umask; be explicit
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def resolve_credentials(*, url: str | None, token: str | None) -> Credentials:
    """Combine overrides with the saved file. Raises ``CliError`` (exit 2) when incomplete.

    A saved token is only sent to the URL it was saved for: pointing the CLI at another
    server with ``GPUFLEET_URL`` must not hand that server your token. Of a server saved
    with several replica URLs, any of them (or several) is that server.
    """
    saved = load_credentials()
    eff_url = url or (saved.url if saved else None)
    eff_token = token
    if eff_token is None and saved is not None and _same_url(saved.url, eff_url):
        eff_token = saved.token
    if not eff_url or not eff_token:
        missing = "server URL" if not eff_url else "API token"
        raise CliError(
            f"no {missing}: run `gpufleet login --url URL --token TOKEN`, "
            f"or set {ENV_URL} and {ENV_TOKEN}"
        )
    return Credentials(url=eff_url, token=eff_token)


def _same_url(saved: str, b: str | None) -> bool:
    if b is None:
        return False
    try:
        return set(parse_server_urls(b)) <= set(parse_server_urls(saved))
    except ValueError:  # a malformed list is nobody's server: the plain comparison decides
        return saved.rstrip("/") == b.rstrip("/")


def make_client(creds: Credentials) -> ApiClient:
    """The one place the CLI builds an ``ApiClient``; tests monkeypatch it.

    Raises ``CliError`` (exit 2) for a URL list the client cannot use."""
    try:
        return ApiClient(base_url=creds.url, token=creds.token)
    except ValueError as exc:
        raise CliError(f"bad server URL: {exc}") from exc


def client_for(ctx: typer.Context) -> ApiClient:
    """An API client from the global options, the environment and the saved file."""
    opts = ctx.find_root().obj
    if not isinstance(opts, GlobalOptions):
        opts = GlobalOptions()
    return make_client(resolve_credentials(url=opts.url, token=opts.token))
