"""``gpufleet slurm``: Slurm's programs — the node hooks slurmd runs on each node
(``cli/slurm_node.py``) and the power-saving programs slurmctld runs
(``cli/slurm_power.py``)."""

from __future__ import annotations

from gpufleet.cli import slurm_node, slurm_power

app = slurm_node.app
app.info.help = "Slurm's programs: node hooks (slurmd, on each node) and power saving (slurmctld)."
app.command("resume")(slurm_power.resume)
app.command("suspend")(slurm_power.suspend)
