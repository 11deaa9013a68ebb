"""Cluster control policies (pure) and their adapter to Ray Serve's autoscaler."""
