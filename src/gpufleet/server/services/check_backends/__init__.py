"""Where a check run's commands run: the agent command channel, or a Slurm job."""
