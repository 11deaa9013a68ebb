"""The continuous batcher: one replica's iteration-level scheduler over a modelled GPU, with
the hooks (admission, clock, preemption) the papers' policies plug into. Shared by the
simulator and the Serve `sim` engine, so both step the same batches."""
