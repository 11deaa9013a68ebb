"""Pure domain model of wattwise: requests, classes, SLOs, replica stats, cluster plans.

Nothing here imports ray or reads the wall clock: time is always passed in, so the
same objects run inside Ray Serve and inside the discrete-event simulator.
"""
