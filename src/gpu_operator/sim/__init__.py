"""The simulator: a real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)
on 127.0.0.1 with fake GPU nodes, used by the integration tests, the demo and the benchmarks."""
