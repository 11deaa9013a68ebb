"""throttLL'eM (Kakolyris et al.): KV/batch projection, a learned performance model, SLO
admission control, minimum-clock throttling and engine-size autoscaling."""
