"""The measurements behind `freetoken bench` and benchmarks/RESULTS.md. `decode` (tok/s per miss
policy, depth and number of streams beside its physical bound), `prefill` (time to first token
per prefill mode) and `startup` (the phases of a cold start) are the library of `freetoken
bench`; the others run as `python3 -m engine.bench.NAME`: `interleave` (code variants taking
turns in one process), `step_profile` (where a decode step's GPU time goes), `make_trace` (a
synthetic routing trace), `make_checkpoint` (a random HuggingFace checkpoint of a real shape, on
disk), `split_model` (decode tok/s per miss policy and with a cross-layer prefetch, estimated on
the CPU from a trace and a profile) and `prefetch_accuracy` (the cross-layer prefetch signal),
`threads` (B_H per CPU thread count beside busy processes; its
thread census is in every `bench decode` row). `quality` (KL, top-1 agreement and perplexity against a reference
model) is `freetoken bench quality`."""
