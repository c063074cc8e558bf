"""A real local Kubernetes control plane for development, tests and `make demo`.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager built from their Go modules
(hack/cluster-bin.sh), with kwok simulating nodes. Production uses a real cluster.
"""
