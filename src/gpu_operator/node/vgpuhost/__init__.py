"""vGPU host state that a reboot loses (SR-IOV VFs, each VF's vGPU type, MIG mode, Fabric Manager
mode): what the node should have, read from the policy and the vGPU device manager's config, and a
level-triggered pass that puts it back before the sandbox validator checks it (docs/vm-passthrough.md)."""
