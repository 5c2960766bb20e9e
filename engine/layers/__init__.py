"""Shared transformer building blocks: norms, rotary embeddings, attention, dense MLP."""
