"""The real node: a kubelet and containerd in a private sandbox (namespaces, cgroups), its
configuration, images and client, and the `nvidia` runtime handler with the container toolkit's
rules over the node's host tree."""
