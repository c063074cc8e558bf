"""Phalanx: a Kubernetes operator for gang-scheduled, preemption-tolerant distributed training."""

__version__ = "0.1.0"
