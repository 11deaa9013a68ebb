"""Performance, power and energy: models calibrated on measurements, GPU control."""
