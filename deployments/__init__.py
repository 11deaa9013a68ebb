"""Ray Serve runtime: ingress, replica deployments, metrics and tracing adapters."""
