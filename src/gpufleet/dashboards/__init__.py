"""Grafana dashboards as code (grafana-foundation-sdk): fleet, GPU, network, storage and
scheduling, over the agent's and the server's /metrics. ``gpufleet dashboards export``
writes them as JSON; docs/dashboards.md says what each shows."""
