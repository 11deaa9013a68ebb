"""Mico's output-length prediction: prompt features, the bucket classifiers, their training
data and measured error. Below the policies and the ingress, which both consume predictions."""
