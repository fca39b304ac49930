"""Repair policy: from findings and history to recommendations (pure)."""
