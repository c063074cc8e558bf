"""Phalanx trainer: the distributed training loop the operator launches in each pod."""

__version__ = "0.1.0"
