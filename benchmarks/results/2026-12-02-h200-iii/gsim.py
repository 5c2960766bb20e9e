"""CPU: the prefill streamer's decisions with the timing fixed (compute per token, B_P), so that only the
group rule differs: GROUPS=old (largest groups that fit) or new (link-bound chunks: E/8)."""
import os, sys
from engine import synthetic
from engine.moe import prefill as pf, qstar
synthetic.SHAPES["probe"] = dict(synthetic.QWEN3, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, num_experts=128, num_experts_per_tok=8,
                                 moe_intermediate_size=32, vocab_size=512)
PER_TOKEN = float(os.environ.get("PER_TOKEN", "3.6e-6"))  # s of compute per token per layer
BP = float(os.environ.get("BP", "128e6"))  # bytes/s: a 12 KiB slot in 96 us, as a 4.6 MiB int8 slot at 50 GB/s
pf.LayerStreamer.estimate = lambda self: self.tokens * PER_TOKEN
orig = qstar.BandwidthEstimator.__init__
def init(self, b_p, b_h, *a, **k):
    orig(self, BP, b_h, *a, **k)
qstar.BandwidthEstimator.__init__ = init
qstar.BandwidthEstimator.fill = lambda self, *a, **k: None  # no online update
if os.environ.get("GROUPS") == "old":
    g = pf.group_size
    pf.group_size = lambda e, s, link_bound=False: g(e, s)
from freetoken_cli.main import app
app(prog_name="freetoken")
