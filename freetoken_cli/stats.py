"""Human-readable generation statistics (stderr)."""
from __future__ import annotations


def format_stats(st) -> str:
    mib, c = 2**20, st.cache
    return (f"prompt {st.prompt_tokens} tok, prefill {st.prefill_tok_s:.1f} tok/s | "
            f"output {st.output_tokens} tok, decode {st.decode_tok_s:.1f} tok/s | "
            f"experts: hit rate {c.hit_rate:.1%} ({c.hits} hits, {c.misses} misses: "
            f"{c.fetched} fetched, {c.cpu} on CPU) | moved {c.bytes_filled / mib:.1f} MiB, "
            f"CPU read {c.bytes_cpu / mib:.1f} MiB | cache {st.cache_occupancy:.0%} full of "
            f"{st.cache_bytes / mib:.1f} MiB | q* {st.q_star:.2f}"
            + (f" (B_P {st.b_p_gbps:.1f}, B_H {st.b_h_gbps:.1f} GB/s)" if st.b_h_gbps is not None else "")
            + (f" | {st.graph_steps} steps as CUDA graphs" if st.graph_steps else "")
            + (f" | experts over {st.world_size} ranks" if st.world_size > 1 else ""))


def print_stats(st) -> None:
    import sys
    print(format_stats(st), file=sys.stderr)
