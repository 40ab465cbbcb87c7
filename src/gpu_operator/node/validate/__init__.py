"""The validator: one check per component, status files under <host-root>/run/nvidia/validations."""
