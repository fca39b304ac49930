"""The Slurm scheduler driver: ``SlurmScheduler`` over the Slurm CLI (``sinfo``, ``squeue``,
``sacct``, ``scontrol``). See ``driver.py``; parsers of Slurm's output are in ``parsing.py``."""
