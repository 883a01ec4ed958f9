"""Shipped sweep specs (``python -m sweeps.run <name>``); see sweeps/README.md."""
