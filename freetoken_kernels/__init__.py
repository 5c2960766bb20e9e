"""Compute kernels: Triton kernels for the GPU, a C++ expert executor for the CPU, and
plain-torch references (freetoken_kernels/ref.py) that define every kernel's semantics and serve as
the CPU path."""
