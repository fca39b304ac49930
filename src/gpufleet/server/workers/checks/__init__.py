"""Check runs: pending → running → passed | failed | error | cancelled.

``runner.py`` is the loop that claims runs and picks each one's step, ``steps.py`` the
steps of an ordinary run, ``localisation.py`` those of a localisation run (bisecting a
failed multi-node all-reduce), ``context.py`` what every step is given.
"""
