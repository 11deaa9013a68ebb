"""Chiron (seed 002): hierarchical backpressure for interactive, mixed and batch replicas."""
