"""Benchmarks behind `freetoken bench`; measured numbers are recorded in RESULTS.md."""
