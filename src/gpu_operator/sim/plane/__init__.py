"""The simulator's control plane and its services: the Go-built binaries, their command lines and
processes, the PKI and kubeconfigs, the apiserver's egress and audit log, kwok's fake nodes, the
registry, the chart repository and Helm, and the operator run as a process against them."""
