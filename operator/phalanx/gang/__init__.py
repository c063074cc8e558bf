"""Pure decision core of gang admission: quantities, node capacity, placement, explanations, backoff.

Nothing here talks to the API server or imports kopf. Inputs are plain dicts shaped like the
Kubernetes API's JSON (camelCase); outputs are frozen dataclasses. docs/scheduling.md explains the rules.
"""
