"""`freetoken bench decode` at depth and with several streams, against `run`'s own statistics."""
import json
import shutil

import pytest

from engine.resolve import DEMO
from test_cli import TOKENIZER_FILES, cli, one_line_error


@pytest.fixture(scope="module")
def deep_hf(tmp_path_factory):
    """A tiny random qwen3_moe with an 8k context and the demo model's tokenizer."""
    import tiny
    from transformers import AutoTokenizer
    d = tmp_path_factory.mktemp("deep") / "hf"
    tiny.build("qwen3_moe", d, vocab_size=len(AutoTokenizer.from_pretrained(DEMO)), max_position_embeddings=8192)
    for f in TOKENIZER_FILES:
        if (DEMO / f).exists():
            shutil.copy(DEMO / f, d / f)
    return d


def test_deep_decode_row_agrees_with_run(deep_hf):
    """A deep row times decode steps only: its per-token time is `run`'s after a prompt as long
    (the bench once timed the prompt's later prefill chunks too: 5x off at this depth)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(DEMO)
    text = "def f(x):\n    return x * 2\n" * 600
    depth = len(tok(text)["input_ids"])
    assert 5000 < depth < 7500  # deeper than a 4096-token prefill chunk
    r = cli("run", deep_hf, "-p", text, "--raw", "--max-tokens", 33, "--ignore-eos", "--device", "cpu",
            "--max-context", 8192, "--json")
    assert r.exit_code == 0, r.output
    run_tok_s = json.loads(r.stdout)["stats"]["decode_tok_s"]
    r = cli("bench", "decode", deep_hf, "--device", "cpu", "--depth", depth, "--tokens", 32, "--repeats", 3,
            "--moe-policy", "adaptive", "--json")
    assert r.exit_code == 0, r.output
    [row] = json.loads(r.stdout)["rows"]
    assert row["depth"] == depth and row["batch"] == 1 and row["tok_s"] == row["stream_tok_s"]
    assert 0.5 < row["tok_s"] / run_tok_s < 2.0, (row["tok_s"], run_tok_s)


def test_depth_and_batch_rows(deep_hf):
    r = cli("bench", "decode", deep_hf, "--device", "cpu", "--depth", "40,300", "--batch", "1,3", "--tokens", 4,
            "--repeats", 1, "--moe-policy", "fetch", "--expert-budget", "1MiB", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [(x["depth"], x["batch"]) for x in rows] == [(40, 1), (40, 3), (300, 1), (300, 3)]
    assert r.stderr.count(" per stream)") == len(rows)
    for x in rows:
        assert x["tok_s"] == pytest.approx(x["batch"] * x["stream_tok_s"])
        assert 0 <= x["hit_rate"] <= 1 and x["cpu"] == 0 and x["bound_tok_s"] > 0 and x["kv_bytes"] > 0
    one_line_error(cli("bench", "decode", deep_hf, "--depth", "1k"), "--depth")
    one_line_error(cli("bench", "decode", deep_hf, "--batch", "0", "--device", "cpu"), "--batch")
    one_line_error(cli("bench", "decode", deep_hf, "--depth", 9000, "--device", "cpu"), "--depth")
