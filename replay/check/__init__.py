"""check: findings, the checker's catalogue and rule families, and the trace diff.

Reads traces only: imports nothing from models, engines or torch, so checking stays fast.
"""
