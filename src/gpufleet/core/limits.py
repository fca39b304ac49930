"""Bounds shared by the agent protocol, the API and the CLI, in a module that costs
nothing to import (the CLI checks ``--gpu`` against them before loading any model)."""

from __future__ import annotations

MAX_GPUS_PER_NODE = 64
