"""Pure policies the reconciler consults: what a pod's state means and what the gang does about it."""
