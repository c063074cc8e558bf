"""The TrainingJob reconcile: a pure decision (lifecycle.py) applied by a thin I/O layer (apply.py)."""
