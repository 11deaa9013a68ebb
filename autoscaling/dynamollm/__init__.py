"""DynamoLLM (seed 000): energy-optimal pools, TP and clocks on three epochs."""
