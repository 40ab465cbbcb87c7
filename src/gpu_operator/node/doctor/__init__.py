"""`gpu-operator doctor`: what is wrong with a host for its intended GPU workload. The finding's
shape (verdict), the checks (findings, guestchecks, vmchecks, troubleshoot, kernellog), what it
reads from the cluster (inputs) and the report (report)."""
