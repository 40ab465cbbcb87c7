"""vfio-manage: move NVIDIA GPUs to vfio-pci and back (manage), in the cluster on this node's
passthrough GPUs (incluster), and its command (cli)."""
