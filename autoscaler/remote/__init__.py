"""The remote executor, whole: the executor, the agents' listener, endpoints, auth, TLS, wheel, workdir shipper."""
