"""Splitwise (004): prompt/token/mixed pools, JSQ on pending tokens, machine-level schedulers."""
