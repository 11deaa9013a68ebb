"""wattwise: the command line and local launch helpers."""
