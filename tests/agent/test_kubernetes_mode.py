"""The agent in a Kubernetes DaemonSet: it reports under its node's name (the downward
API's spec.nodeName), which is what the server's Kubernetes driver knows it by."""

from __future__ import annotations

import pytest

from gpufleet.agent.settings import AgentSettings


def test_the_node_name_is_the_reported_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_AGENT_KUBERNETES_NODE", "gpu-node-17")
    monkeypatch.setenv("GPUFLEET_AGENT_HOSTNAME", "gpufleet-agent-x7k2p")  # the pod's name
    settings = AgentSettings()
    assert (settings.kubernetes_node, settings.hostname) == ("gpu-node-17", "gpu-node-17")


def test_outside_kubernetes_the_hostname_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_AGENT_KUBERNETES_NODE", raising=False)
    monkeypatch.setenv("GPUFLEET_AGENT_HOSTNAME", "gpu-a")
    assert AgentSettings().hostname == "gpu-a"
