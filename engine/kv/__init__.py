"""KV memory: the paged KV pool, the per-step batch description, and prefix sharing."""
