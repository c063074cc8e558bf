"""Not imported by the agent: this directory goes on each pod's PYTHONPATH (see sitecustomize)."""
