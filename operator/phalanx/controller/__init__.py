"""The work loop: a de-duplicating queue of TrainingJob keys, reconcile workers, and the gang
admission pass. kopf's handlers (handlers.py) only enqueue keys here; composition.py lists the parts.

Level-triggered: every reconcile reads the job and its pods as they are now and asks the pure state
machine (reconcile/lifecycle.py) what to do, so a lost or repeated event changes nothing. Reconciles
and admission read watch-fed stores (cache.py, reflector.py) that the operator's own writes update
from the API's replies; a reconcile asks the API for a job the store does not have yet.
"""

from phalanx.controller.composition import Controller

__all__ = ["Controller"]
