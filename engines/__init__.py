"""Engines behind one protocol: the simulated GPU replica (real or virtual time) and vLLM."""
