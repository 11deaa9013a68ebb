"""Request-path policies (classify, predict, route) and the Serve application builder."""
