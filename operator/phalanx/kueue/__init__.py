"""Phalanx under Kueue (docs/kueue.md): the Workload, what Kueue says of it, the flavors on the pods, and what the owner writes back (pure)."""
