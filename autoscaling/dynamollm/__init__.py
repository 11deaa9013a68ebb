"""DynamoLLM (Stojkovic et al.): energy-optimal pools, TP and clocks on three epochs."""
