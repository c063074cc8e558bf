"""One rule of the TrainingJob state machine per module (pure), in the order decide() applies them
(reconcile/lifecycle.py). Each `apply(b, seen)` writes into the plan being built and returns True
when the decision is complete (no later rule runs)."""
