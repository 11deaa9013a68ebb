"""Trace-driven discrete-event simulator that runs the same policies as Ray Serve."""
