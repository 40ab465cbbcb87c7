"""The `gpu-operator sim` commands (`cli`) and what they run: a detached session and its state
file, its reuse, the demo (and the nested demo), and fault injection into a running simulator."""
