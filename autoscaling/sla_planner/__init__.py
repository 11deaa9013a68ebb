"""NVIDIA Dynamo's SLA planner as a baseline (`policy: sla-planner`)."""
