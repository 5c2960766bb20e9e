"""Expert memory and execution. router: the model's top-k for every architecture; replay: trace
replay, uniform routing and the trace recorder that can stand in for it; block: the MoE block of a
decoder layer; layout: the slot layout of one expert; store: the host expert store (source of
truth); cache: the device expert cache shared by all MoE layers, and its counters; tables: the
residency tables (host and device); policy: the miss policy; qstar: q* and its upkeep; runtime:
one MoE layer step (eager); device_control: the same step with device-resident control (CUDA
graphs); prefill: full-layer streaming for long prefill chunks."""
