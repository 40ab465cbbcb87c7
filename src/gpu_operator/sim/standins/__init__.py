"""The stand-ins: what NVIDIA's node components (and ours) do to the API on kwok nodes, which run no
container, each acting only while its component's pod runs there and through its channel. The one
table of them, from which the docs' table, the played list and the runner derive, is `roster`;
`podwatch` is their machinery, `identity` who each calls as."""
