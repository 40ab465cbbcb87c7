"""The hardware models: host trees (sysfs, procfs, device nodes; a VM guest's), the GPUs' MIG
state and profiles, a vGPU host, NVML over a host tree, and the faults and recovery actions played
on them."""
