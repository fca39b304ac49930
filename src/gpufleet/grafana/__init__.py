"""Grafana provisioning through its HTTP API: one organisation per gpufleet project
(docs/grafana.md). ``client.py`` is the only I/O; ``sync.py`` decides what to change."""
