"""Acceptance runs: node → cluster → gating → done (``AcceptanceStage``).

``runner.py`` is the loop (startup scripts, adopting nodes, a step per run, settling
clusters) and its ``{stage: step}`` table; ``node_stage.py``, ``cluster_stage.py`` and
``gating.py`` the steps; ``finishing.py`` the verdicts and the report that end a run's
checks; ``adoption.py`` how a node in acceptance gets a run; ``context.py`` what every
step is given; ``planning.py`` the pure helpers.

How a node's verdict is made: the worst of its node-level checks (pass, warn: passed;
skipped: it ran a job and the run was not forced; fail); then, at cluster level, a
failed cluster-wide run fails the nodes it (or its localisation) pinned. A failure
pinned on nobody (a slow fabric that bisecting could not narrow to a node) fails the run
without cordoning anyone: those nodes stay in acceptance and the cluster with them,
with the reason in its status detail, until an admin runs the suite again. A repair's
run ends at ``done`` right after its report: the repair's verifying step reads the
outcome and moves the node itself.
"""
