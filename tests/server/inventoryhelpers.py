"""An app with a secret key, and helpers for the inventory and credential tests."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from gpufleet.testing.app import RunningApp, make_settings, running_app

KEY_A = base64.urlsafe_b64encode(bytes(range(32))).decode()
KEY_B = base64.urlsafe_b64encode(bytes(range(100, 132))).decode()
KEY_C = base64.b64encode(bytes(range(200, 232))).decode()  # standard alphabet works too


@asynccontextmanager
async def keyed_app(
    database_url: str, tmp_path: Path, **settings: Any
) -> AsyncIterator[RunningApp]:
    values: dict[str, Any] = {"secret_key": KEY_A, **settings}
    config = make_settings(data_dir=tmp_path / "data", database_url=database_url, **values)
    async with running_app(config) as running:
        yield running


async def put_credential(
    client: httpx.AsyncClient,
    name: str,
    *,
    secret: str,
    project: str = "ml",
    kind: str = "bmc_password",
    username: str | None = "root",
) -> httpx.Response:
    return await client.put(
        f"/api/v1/projects/{project}/credentials/{name}",
        json={"kind": kind, "username": username, "secret": secret},
    )


async def import_hosts(
    client: httpx.AsyncClient, hosts: list[dict[str, Any]], *, project: str = "ml"
) -> httpx.Response:
    return await client.post(f"/api/v1/projects/{project}/hosts/import", json={"hosts": hosts})


def host(hostname: str, **extra: Any) -> dict[str, Any]:
    return {"hostname": hostname, "bmc_type": "redfish", "bmc_address": "https://10.0.0.1", **extra}
