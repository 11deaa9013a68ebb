"""Chiron (Patke et al.): hierarchical backpressure for interactive, mixed and batch replicas."""
