"""A mirror of the coordination store (etcd, or the embedded single-node store)."""
