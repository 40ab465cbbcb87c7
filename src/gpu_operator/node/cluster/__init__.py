"""The node agents' side of the cluster: their in-cluster client (kubeapi: node labels, events,
validation pods, health requests), lightkube's types made ready before threads decode (kubetypes),
and what the probe DaemonSet publishes about its node (publish)."""
