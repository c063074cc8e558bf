"""A development node that really runs pods: containers become local processes.

A stand-in for a kubelet on one machine, for the demo and end-to-end tests. Production uses a real
kubelet; docs/dev-node.md lists what this agent does differently.
"""
