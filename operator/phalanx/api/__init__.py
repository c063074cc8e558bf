"""The TrainingJob API: typed models (v1alpha1.py) that both parse objects and generate the CRD."""
