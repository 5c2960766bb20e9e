"""`freetoken bench decode` at depth and with several streams, against `run`'s own statistics."""
import json
import shutil
from pathlib import Path

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
    assert 1 / 3 < row["tok_s"] / run_tok_s < 3, (row["tok_s"], run_tok_s)  # the defect was 5x; `run` times once


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


def test_sampled_rows(deep_hf, monkeypatch):
    """--sampling draws every decoded token as asked (rows say how); a bad value is one line."""
    import engine.scheduler
    drawn, sample = [], engine.scheduler.sample
    monkeypatch.setattr(engine.scheduler, "sample", lambda x, params, *a: drawn.extend(params) or sample(x, params, *a))
    r = cli("bench", "decode", deep_hf, "--device", "cpu", "--depth", 40, "--tokens", 4, "--repeats", 1,
            "--moe-policy", "fetch", "--sampling", "temperature=0.8,top_k=5,top_p=0.9", "--json")
    assert r.exit_code == 0, r.output
    [row] = json.loads(r.stdout)["rows"]
    assert row["sampling"] == "temperature=0.8,top_k=5,top_p=0.9" and row["tok_s"] > 0
    assert sum(p.temperature == 0.8 and p.top_k == 5 and p.top_p == 0.9 for p in drawn) >= 4  # the timed steps'
    one_line_error(cli("bench", "decode", deep_hf, "--sampling", "temp=1", "--device", "cpu"), "--sampling")
    one_line_error(cli("bench", "decode", deep_hf, "--sampling", "top_p=2", "--device", "cpu"), "top_p")
    one_line_error(cli("bench", "decode", "--synthetic", "tiny", "--sampling", "model", "--device", "cpu"),
                   "--sampling model")


def test_startup_reports_the_phases(deep_hf, monkeypatch):
    import time

    import engine.bench.startup as startup
    read_speed = startup.read_speed

    def slow_disk(path):  # the disk's own timing is not part of the start, however long it takes
        time.sleep(0.5)
        return read_speed(path)
    monkeypatch.setattr(startup, "read_speed", slow_disk)
    r = cli("bench", "startup", deep_hf, "--device", "cpu", "--prompt-tokens", 64, "--max-context", 1024, "--json")
    assert r.exit_code == 0, r.output
    x = json.loads(r.stdout)
    assert list(x["phases"]) == ["import", "setup", "header", "driver", "device", "dense", "kv", "cache", "experts", "pin", "prefill", "compile",
                                 "capture", "wait", "profile"]
    assert all(s >= 0 for s in x["phases"].values())
    assert abs(x["ready_s"] - sum(x["phases"].values())) < 0.25  # the phases account for the whole start
    assert x["expert_bytes"] > 0 and x["read_s"] > 0 and x["read_gbps"] > 0 and x["disk_gbps"] > 0 and x["read_bound_s"] > 0
    assert x["prompt_tokens"] == 64 and x["first_prefill_s"] > 0 and x["second_prefill_s"] > 0
    assert x["fx_graph_cache_miss"] == 0  # nothing compiles on the CPU path
    r = cli("bench", "startup", "--synthetic", "tiny", "--device", "cpu", "--prompt-tokens", 16, "--max-context", 256)
    assert r.exit_code == 0, r.output
    assert "first prefill" in r.stdout and "synthetic" in r.stdout


def test_the_start_is_timed_from_the_process_start():
    """bench startup's clock starts with the process: a fresh interpreter that imports the CLI's
    bench module finds its own start a fraction of a second before (psutil's create_time, built on
    the boot time in whole seconds, was up to a second early)."""
    import subprocess
    import sys
    code = "import time; from freetoken_cli.bench import process_start; print(time.time() - process_start())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 <= age < 0.6, age


def test_compiled_artifacts_go_to_the_cache_dir(monkeypatch, tmp_path):
    from engine.config import persist_compile_caches
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path))
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    persist_compile_caches()
    import triton
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    assert Path(cache_dir()).is_relative_to(tmp_path) and Path(triton.knobs.cache.dir).is_relative_to(tmp_path)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")  # the user's choice wins
    persist_compile_caches()
    assert triton.knobs.cache.dir == "/elsewhere"


def test_bytecode_goes_to_the_cache_dir_only_where_it_cannot_sit_beside_the_sources(monkeypatch, tmp_path):
    import importlib.util
    import os
    import sys
    from engine.config import bytecode_prefix
    pkg = tmp_path / "src" / "somepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert bytecode_prefix("somepkg") is None  # writable: Python's default place
    monkeypatch.setattr(os, "access", lambda *a: False)  # a read-only install
    assert bytecode_prefix("somepkg") == str(tmp_path / "cache" / "pycache")
    cached = importlib.util.cache_from_source(str(pkg / "__init__.py"))
    os.makedirs(os.path.dirname(cached))
    open(cached, "wb").close()
    assert bytecode_prefix("somepkg") is None  # its bytecode is there already
    os.remove(cached)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE: the user's choice
    assert bytecode_prefix("somepkg") is None


@pytest.mark.gpu
def test_a_second_start_reuses_the_compiled_artifacts(tmp_path):
    """Two cold starts in fresh processes: the second compiles nothing new (no Triton kernel,
    no torch.compile graph)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env["FREETOKEN_CACHE"] = str(tmp_path)
    cmd = [sys.executable, "-m", "freetoken_cli.main", "bench", "startup", "--synthetic", "tiny", "--prompt-tokens", "64",
           "--max-context", "1024", "--json"]
    runs = [json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout) for _ in range(2)]
    assert runs[0]["triton_compiled"] > 0 and runs[0]["phases"]["compile"] > 0
    assert runs[1]["triton_compiled"] == 0 and runs[1]["fx_graph_cache_miss"] == 0


def test_make_checkpoint_builds_a_convertible_model(tmp_path):
    from engine.bench.make_checkpoint import build
    build(tmp_path / "hf", "tiny", layers=2)
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    r = cli("bench", "startup", tmp_path / "hf", "--device", "cpu", "--prompt-tokens", 16, "--max-context", 256, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["expert_bytes"] == 2 * 16 * 3 * 64 * 32 * 2  # layers x experts x 3 matrices, bf16
