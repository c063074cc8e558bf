"""Pure functions that build the objects a TrainingJob owns."""
