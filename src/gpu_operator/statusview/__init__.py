"""The status view: GPU nodes x components, the ClusterPolicy state and what is not ready."""
