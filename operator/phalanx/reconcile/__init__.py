"""The TrainingJob state machine (pure): decide() in lifecycle.py applies the rules in rules/, one
module per rule, to what observed.py reads; plan.py is what it returns. The I/O layer that applies
it is controller/reconciler.py."""
