"""parity.sandboxes: Isolated execution of model-written code: local namespaces and Docker backends, pools."""
