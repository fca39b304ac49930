"""Repairs: findings → recommendations → approved repairs carried out on the node.

``planner.py`` is the loop that turns open findings into recommendations (the pure
policy in ``core.repair``). ``executor.py`` is the loop that takes each approved repair
through approved → cordoning → draining → acting → verifying → succeeded | failed, one
step per status from its ``STEPS`` table: ``cordoning.py`` (approved, cordoning),
``draining.py`` (draining, and admins' drains with no repair behind them),
``acting.py``, ``verifying.py``. ``context.py`` is what every step is given.
"""
