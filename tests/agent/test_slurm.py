from __future__ import annotations

import json

from gpufleet.agent.collectors.slurm import parse_json, parse_text

TEXT = """NodeName=gpu-node-07 Arch=x86_64 CoresPerSocket=48
   State=IDLE+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1
   Reason=NHC: check_nvsmi_healthmon:  nvidia-smi:  GPU fell off [root@2024-08-20T16:32:47]
"""


def test_text_form() -> None:
    node = parse_text(TEXT)
    assert node is not None and node.state == "drain"
    assert node.reason == "NHC: check_nvsmi_healthmon:  nvidia-smi:  GPU fell off"


def test_text_form_down_not_responding() -> None:
    node = parse_text("NodeName=n1 State=DOWN*+NOT_RESPONDING Reason=Not responding [slurm@x]")
    assert node is not None and node.state == "down" and node.reason == "Not responding"


def test_json_form() -> None:
    doc = {"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "gpufleet: r-1"}]}
    node = parse_json(json.dumps(doc))
    assert node is not None and node.state == "drain" and node.reason == "gpufleet: r-1"
    assert parse_json(json.dumps({"nodes": []})) is None
