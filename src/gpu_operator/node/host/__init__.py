"""Reading the host (and the few writes the agents make to it), from its root only: the host root
and its sysfs write seam (hostfs), PCI functions (pci, data/nvidia.ids), the driver, the VM guest
facts, the processes that hold GPUs, the boot config that keeps a vfio binding (persist), the
container runtime, the one runner of host binaries, and the probe that gathers them into one
HostReport. Imports no other room of node/."""
