"""The Kubernetes driver's tests: the API emulator (``gpufleet.testing.kube_api``) and a
driver pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpufleet.schedulers.kubernetes.config import KubernetesConfig
from gpufleet.schedulers.kubernetes.driver import KubernetesScheduler
from gpufleet.testing.kube_api import RunningKubeApi, kube_api


@pytest.fixture
async def api() -> AsyncIterator[RunningKubeApi]:
    async with kube_api() as running:
        yield running


@pytest.fixture
async def driver(api: RunningKubeApi) -> AsyncIterator[KubernetesScheduler]:
    scheduler = KubernetesScheduler(KubernetesConfig(kubeconfig=api.kubeconfig(), timeout_s=5))
    try:
        yield scheduler
    finally:
        await scheduler.aclose()
