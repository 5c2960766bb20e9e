"""The measurements behind `freetoken bench` and benchmarks/RESULTS.md. `decode` (tok/s per miss
policy beside its physical bound) and `prefill` (time to first token per prefill mode) are the
library of `freetoken bench`; the others run as `python3 -m engine.bench.NAME`: `interleave`
(code variants taking turns in one process), `step_profile` (where a decode step's GPU time
goes), `make_trace` (a synthetic routing trace), `split_model` (what whole-expert splits cost on a
trace), `prefetch_accuracy` (the cross-layer prefetch signal) and `threads` (B_H per CPU thread
count beside busy processes; its thread census is in every `bench decode` row)."""
