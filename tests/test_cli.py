"""The command line through Typer's CliRunner: convert, one-shot run (prompt and piped stdin),
--json, and one-line errors with a non-zero exit code for every mistake a user can make."""
import json
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.resolve import DEMO
from freetoken_cli.main import app

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def cli(*args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def one_line_error(r, *words):
    assert r.exit_code != 0
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A tiny random qwen3_moe in HF layout that uses the demo model's tokenizer."""
    import tiny
    from transformers import AutoTokenizer
    d = tmp_path_factory.mktemp("cli") / "hf"
    tiny.build("qwen3_moe", d, vocab_size=len(AutoTokenizer.from_pretrained(DEMO)))
    for f in TOKENIZER_FILES:
        if (DEMO / f).exists():
            shutil.copy(DEMO / f, d / f)
    return d


def test_help_is_instant_and_imports_no_torch():
    code = "import sys, freetoken_cli.main; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "freetoken_cli.main", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "convert" in out.stdout and "serve" in out.stdout
    assert time.perf_counter() - t0 < 3.0  # a fresh interpreter included; well under 1 s when warm


def test_convert_then_run_json(tiny_hf, tmp_path, monkeypatch):
    from ftw import early
    started, start = [], early.start
    monkeypatch.setattr(early, "start", lambda p: started.append(p) or start(p))
    out = tmp_path / "ftw"
    r = cli("convert", tiny_hf, out)
    assert r.exit_code == 0, r.output
    assert (out / "ftw.json").exists() and (out / "tokenizer.json").exists()
    one_line_error(cli("convert", tiny_hf, out), "--force")
    assert cli("convert", tiny_hf, out, "--force").exit_code == 0
    r = cli("run", out, "--prompt", "def f(x):", "--json", "--max-tokens", 8, "--ignore-eos", "--device", "cpu",
            "--raw")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert len(res["token_ids"]) == 8 and isinstance(res["text"], str)
    for key in ("prefill_tok_s", "decode_tok_s", "expert_hits", "expert_misses", "bytes_filled"):
        assert key in res["stats"]
    assert started == [out] and early.take(out) is None  # the experts' read began before the load, which took it


def test_a_model_whose_experts_do_not_fit_in_host_memory_is_refused(tiny_hf, tmp_path, monkeypatch):
    """Experts larger than the host memory available: no early read begins, and the load says so
    in one line before reading anything (was: the kernel's OOM killer, mid-read)."""
    import psutil
    from ftw import early
    out = tmp_path / "ftw"
    assert cli("convert", tiny_hf, out).exit_code == 0
    mem = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: mem._replace(available=4096))
    one_line_error(cli("run", out, "--prompt", "hi", "--max-tokens", 2, "--device", "cpu"),
                   "GiB of host memory", "--quant int4")
    assert not early.started(out)


def test_run_hf_directory_converts_once(tiny_hf):
    """The second run finds the conversion without torch (so its experts' read begins before the
    import, ftw.early); a changed source is not that conversion."""
    from engine.config import cache_dir
    from engine.resolve import ftw_dir
    models = cache_dir() / "models"
    before = set(models.iterdir()) if models.exists() else set()
    for _ in range(2):
        r = cli("run", tiny_hf, "-p", "x = ", "--raw", "--max-tokens", 2, "--device", "cpu", "--json")
        assert r.exit_code == 0, r.output
    new = set(models.iterdir()) - before
    assert len(new) == 1 and ftw_dir(str(tiny_hf), converted=True) == new.pop()
    assert ftw_dir(str(tiny_hf)) is None  # not without `converted`
    side = tiny_hf / "generation_config.json"
    kept = side.read_bytes() if side.exists() else None
    side.write_text('{"temperature": 0.5}')  # an edited side file: another model
    try:
        assert ftw_dir(str(tiny_hf), converted=True) is None
    finally:
        side.write_bytes(kept) if kept is not None else side.unlink()


def test_run_takes_sampling_defaults_from_the_model(tiny_hf, tmp_path):
    """generation_config.json's sampling values apply where the command line gives none (a bad
    top_p there is reported, --top-p overrides it); a greedy config keeps greedy decoding."""
    from engine.sampling import model_defaults
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf, hf)
    (hf / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_p": 0, "eos_token_id": 2}))
    assert model_defaults(hf) == {"temperature": 1.0, "top_p": 0, "top_k": 50}  # transformers' values if unset
    one_line_error(cli("run", hf, "-p", "x", "--raw", "--max-tokens", 1, "--device", "cpu"), "top_p")
    assert cli("run", hf, "-p", "x", "--raw", "--max-tokens", 1, "--device", "cpu", "--top-p", 0.9).exit_code == 0
    (hf / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    assert model_defaults(hf) == {}


def test_piped_stdin_prints_only_the_answer(tiny_hf):
    r = cli("run", tiny_hf, "--prompt", "explain", "--max-tokens", 6, "--ignore-eos", "--device", "cpu",
            "--verbose", input="def add(a, b):\n    return a + b\n")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() and "hit rate" not in r.stdout  # stats go to stderr
    assert "hit rate" in r.stderr and "decode" in r.stderr


@contextmanager
def serving(model: Path, **options):
    """A live `freetoken serve` of MODEL on a free loopback port: (its Server, the port)."""
    from test_server import listening

    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.server.app import create_app
    app = create_app(lambda progress: LLM(EngineConfig(model=str(model), device="cpu"), progress), "tiny", **options)
    with listening(app) as port:
        state, deadline = app.state.server, time.time() + 300
        while state.batcher is None and state.error is None and time.time() < deadline:
            time.sleep(0.05)
        assert state.batcher is not None, state.error
        yield state, port


def test_run_through_a_running_server_gives_the_in_process_tokens(tiny_hf, monkeypatch, capsys):
    from freetoken_cli.client import find_server
    with serving(tiny_hf, reasoning_parser="think") as (server, port):
        monkeypatch.setenv("FREETOKEN_PORT", str(port))
        totals = server.batcher.llm.scheduler.totals
        for args in (["--system", "Be brief."], ["--raw"]):
            cmd = ["run", tiny_hf, "-p", "def f(x):", "--max-tokens", 8, "--ignore-eos", "--device", "cpu", *args]
            before = totals["decode_tokens"]
            remote, local = cli(*cmd), cli(*cmd, "--no-server")
            assert remote.exit_code == local.exit_code == 0, remote.output + local.output
            assert remote.stdout == local.stdout and remote.stdout.strip() and remote.stderr == ""
            assert totals["decode_tokens"] == before + 7  # the server answered (the first token is prefill's)
        assert find_server(str(DEMO)) is None  # another model: `run` loads its own, saying so in one line
        assert capsys.readouterr().err.count("\n") == 1


def test_run_loads_the_model_when_no_server_answers(tiny_hf):
    from freetoken_cli.client import find_server
    t0 = time.perf_counter()
    assert find_server(str(tiny_hf)) is None  # nothing listens on FREETOKEN_PORT (conftest)
    assert time.perf_counter() - t0 < 0.2
    r = cli("run", tiny_hf, "-p", "x = ", "--raw", "--max-tokens", 2, "--device", "cpu")
    assert r.exit_code == 0 and r.stdout.strip() and r.stderr == "", r.output


def test_bad_input_gives_one_line_errors(tiny_hf, tmp_path):
    one_line_error(cli("run", tmp_path / "missing", "-p", "hi"), "not found")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--expert-budget", "lots"), "size")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--expert-budget", "1KiB", "--device", "cpu"), "--expert-budget")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--moe-policy", "sometimes"), "--moe-policy")
    one_line_error(cli("run", tiny_hf, "-p", "hi " * 50, "--max-context", 16, "--device", "cpu"), "context")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--device", "tpu"), "--device")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--top-p", 0), "top_p")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--prefill-chunk", "8"), "--prefill-chunk")
    one_line_error(cli("convert", "no/such-model-anywhere", tmp_path / "o"), "Hub")


def test_bad_checkpoints_are_refused(tiny_hf, tmp_path):
    ftw = tmp_path / "ftw"
    assert cli("convert", tiny_hf, ftw).exit_code == 0
    index = json.loads((ftw / "ftw.json").read_text())
    index["version"] = 99
    (ftw / "ftw.json").write_text(json.dumps(index))
    one_line_error(cli("run", ftw, "-p", "hi"), "upgrade")
    odd = tmp_path / "odd"
    shutil.copytree(tiny_hf, odd)
    cfg = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    one_line_error(cli("convert", odd, tmp_path / "o1"), "qwen3_moe")
    (odd / "config.json").write_text(json.dumps(cfg))
    (odd / "model.safetensors").write_bytes(b"\x00" * 64)
    one_line_error(cli("convert", odd, tmp_path / "o2"), "model.safetensors")
    assert not (tmp_path / "o2").exists() and not list(tmp_path.glob(".o2*"))


def test_record_trace_then_bench_decode_replays_it(tiny_hf, tmp_path):
    import numpy as np
    trace = tmp_path / "trace.npy"
    r = cli("run", tiny_hf, "-p", "def f(x):", "--raw", "--max-tokens", 6, "--ignore-eos", "--device", "cpu",
            "--record-trace", trace)
    assert r.exit_code == 0, r.output
    ids = np.load(trace)
    assert ids.shape[1:] == (3, 2) and ids.shape[0] >= 6 and ids.max() < 8
    r = cli("bench", "decode", tiny_hf, "--device", "cpu", "--tokens", 4, "--repeats", 1, "--expert-budget",
            "1MiB", "--moe-policy", "adaptive,fetch,cpu", "--routing", f"model,trace:{trace}", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [(x["routing"], x["policy"]) for x in rows] == [
        (rt, p) for rt in ("model", "trace.npy") for p in ("adaptive", "fetch", "cpu")]
    assert r.stderr.count(" tok/s") == len(rows)  # each row reported as it is measured
    for x in rows:
        assert x["tok_s"] > 0 and 0 <= x["hit_rate"] <= 1 and x["bound_tok_s"] > 0
        assert x["b_p_online_gbps"] > 0 and x["b_h_online_gbps"] > 0
        if x["policy"] == "fetch":
            assert x["cpu"] == 0
        if x["policy"] == "cpu":
            assert x["fetched"] == 0
    one_line_error(cli("bench", "decode", tiny_hf, "--routing", "trace:/no/such.npy", "--device", "cpu"), "trace")


def test_bench_decode_out_keeps_the_rows_of_a_bench_cut_short(tiny_hf, tmp_path, monkeypatch):
    import engine.bench.decode as bench
    measured = bench.measure_policy

    def interrupted(*a, **k):
        raise KeyboardInterrupt  # stopped after the first row (Ctrl-C; a time limit kills it between rows alike)

    def first_then_interrupted(*a, **k):
        monkeypatch.setattr(bench, "measure_policy", interrupted)
        return measured(*a, **k)
    monkeypatch.setattr(bench, "measure_policy", first_then_interrupted)
    out = tmp_path / "rows.json"
    r = cli("bench", "decode", tiny_hf, "--device", "cpu", "--tokens", 2, "--repeats", 1, "--expert-budget",
            "1MiB", "--moe-policy", "fetch,cpu", "--out", out)
    assert r.exit_code == 130
    assert [x["policy"] for x in json.loads(out.read_text())["rows"]] == ["fetch"]
    assert "of its bound" in r.stderr


def test_bench_decode_online_and_fixed_q_take_turns(tiny_hf, tmp_path, monkeypatch):
    from engine import profile
    from engine.moe.qstar import BandwidthEstimator
    monkeypatch.setattr(BandwidthEstimator.__init__, "__defaults__", (0.1, 0))  # time the tiny experts too
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path))  # a saved profile with q* = 0.5
    profile.save({"machine": profile.machine(), "h2d_concurrent_gbps": 1.0, "cpu_expert_concurrent_gbps": 1.0,
                  "h2d_gbps": 1.0, "cpu_expert_gbps": 1.0, "q_star": 0.5})
    r = cli("bench", "decode", tiny_hf, "--device", "cpu", "--tokens", 4, "--repeats", 2, "--expert-budget",
            "200KiB", "--moe-policy", "adaptive-fixed,fetch,adaptive", "--routing", "uniform", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [x["policy"] for x in rows] == ["adaptive (fixed q*)", "adaptive", "fetch"]  # one runtime, in turns
    assert rows[0]["q_star"] == 0.5 and "b_p_online_gbps" not in rows[0]
    # re-estimated from this machine's timings: the bandwidths left the profile's 1 GB/s (q* itself can
    # land near 0.5 again when both sides moved alike)
    online = (rows[1]["b_p_online_gbps"], rows[1]["b_h_online_gbps"])
    assert online != pytest.approx((1.0, 1.0), rel=1e-3)


def test_bench_decode_rows_per_thread_count(tiny_hf, monkeypatch):
    """--cpu-threads takes a comma list: one load, the rows of each count in turn, each row with
    the count asked for, the pool's (capped by the cores left beside the host threads: 2 of 4)
    and the cores its threads kept busy. The prompt is deep enough that the second run needs the KV
    pages the first one's prompts held."""
    from freetoken_kernels import cpu_executor
    monkeypatch.setattr(cpu_executor, "_core_cpus", lambda: [0, 1, 2, 3])
    r = cli("bench", "decode", tiny_hf, "--device", "cpu", "--tokens", 2, "--repeats", 1, "--expert-budget",
            "1MiB", "--moe-policy", "cpu", "--depth", 400, "--cpu-threads", "1,5", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [(x["threads"], x["pool_threads"]) for x in rows] == [(1, 1), (5, 2)]
    assert all(x["tok_s"] > 0 and x["cpu_busy"]["main"] > 0 for x in rows)
    one_line_error(cli("bench", "decode", tiny_hf, "--cpu-threads", "4,x"), "--cpu-threads")


def test_bench_prefill_rows(tiny_hf):
    r = cli("bench", "prefill", tiny_hf, "--device", "cpu", "--lengths", "64,160", "--follow-up", 12,
            "--prefill-chunk", 64, "--repeats", 2, "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [(x["mode"], x["prompt"]) for x in rows] == [
        (m, p) for m in ("stream", "routed", "adaptive") for p in ("cold", "cold", "+12 after 160")]
    for x in rows:
        assert x["ttft_s"] > 0 and x["bound_s"] > 0 and x["chunk"] == 64
        assert len(x["ttft_runs"]) == 2 and x["cpu_gib"] >= 0 and x["ttft_s"] == sum(x["ttft_runs"]) / 2  # the median of two
        assert (x["streamed_layers"] > 0) == (x["mode"] == "stream" and x["prompt"] == "cold")
    r = cli("bench", "prefill", tiny_hf, "--device", "cpu", "--lengths", 96, "--follow-up", 12, "--mode", "routed,adaptive",
            "--repeats", 1, "--expert-budget", "200KiB,1GiB", "--json")  # a partial cache, then every expert: the floor
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [(x["all_resident"], x["mode"]) for x in rows] == [(a, m) for a in (False, True) for m in ("routed", "adaptive")
                                                              for _ in range(2)]
    assert rows[0]["budget_gib"] < rows[-1]["budget_gib"] and all(x["of_floor"] == 1 for x in rows[4:])
    assert [x["of_floor"] for x in rows[:4]] == [x["ttft_s"] / y["ttft_s"] for x, y in zip(rows[:4], rows[4:])]
    r = cli("bench", "prefill", tiny_hf, "--device", "cpu", "--lengths", 64, "--follow-up", 0, "--mode", "routed", "--json")
    assert r.exit_code == 0, r.output
    [row] = json.loads(r.stdout)["rows"]
    assert row["chunk"] == 256  # by default the engine's own (its floor, for an 80-token context)
    assert row["all_resident"] and row["of_floor"] == 1  # the default budget holds the tiny model's experts
    one_line_error(cli("bench", "prefill", tiny_hf, "--mode", "teleport"), "teleport")


def test_bench_decode_synthetic_quantized_experts():
    """--synthetic --quant F: the shape's experts in that format; a slot is smaller than bf16's, so
    the same budget holds more experts, and the rows say how many bytes a fill moves."""
    rows = {}
    for quant in (None, "int4"):
        args = ["--quant", quant] if quant else []
        r = cli("bench", "decode", "--synthetic", "tiny", *args, "--device", "cpu", "--tokens", 2, "--repeats", 1,
                "--expert-budget", "1MiB", "--moe-policy", "fetch", "--json")
        assert r.exit_code == 0, r.output
        [rows[quant]] = json.loads(r.stdout)["rows"]
    assert rows["int4"]["hit_rate"] >= rows[None]["hit_rate"]
    assert rows["int4"]["hit_bytes"] / max(rows["int4"]["hits"], 1e-9) < rows[None]["hit_bytes"] / max(rows[None]["hits"], 1e-9) / 2
    r = cli("bench", "decode", "--synthetic", "tiny", "--quant", "int3", "--device", "cpu")
    one_line_error(r, "--quant applies to --synthetic")


def test_version():
    from importlib.metadata import version
    r = cli("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"freetoken {version('freetoken')}"


def test_ls_verify_rm_the_converted_models(tiny_hf, tmp_path, monkeypatch):
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path / "cache"))
    r = cli("ls")
    assert r.exit_code == 0 and not r.stdout and "no converted models" in r.stderr
    assert cli("run", tiny_hf, "-p", "x", "--raw", "--max-tokens", 1, "--device", "cpu").exit_code == 0
    r = cli("ls")
    assert r.exit_code == 0, r.output
    header, row = r.stdout.splitlines()
    assert header.split() == ["NAME", "SOURCE", "FORMAT", "SIZE"]
    name, source, fmt, size, unit = row.split()
    assert source == str(tiny_hf) and fmt == "float32" and unit in ("KiB", "MiB") and float(size) > 0
    r = cli("verify", name)
    assert r.exit_code == 0 and "every checksum matches" in r.stdout, r.output
    ftw = tmp_path / "cache" / "models" / name
    corrupt_an_expert(ftw)
    one_line_error(cli("verify", name), "model.layers.0.mlp.experts", "corrupt")
    one_line_error(cli("verify", ftw), "corrupt")
    one_line_error(cli("run", name, "-p", "x", "--raw", "--max-tokens", 1, "--device", "cpu", "--verify"), "corrupt")
    assert cli("rm", name).exit_code == 0 and not ftw.exists()
    assert "no converted models" in cli("ls").stderr
    one_line_error(cli("rm", name), "freetoken ls")
    one_line_error(cli("rm", ".."), "freetoken ls")


def corrupt_an_expert(ftw: Path) -> None:
    """Flip bytes inside layer 0's expert bank, leaving every size as it was."""
    entry = json.loads((ftw / "ftw.json").read_text())["tensors"]["model.layers.0.mlp.experts"]
    with open(ftw / entry["shard"], "r+b") as f:
        f.seek(entry["offset"] + 100)
        data = f.read(8)
        f.seek(entry["offset"] + 100)
        f.write(bytes(b ^ 0xFF for b in data))


def test_bad_run_options_are_one_line_before_any_work(tiny_hf, tmp_path):
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--cpu-threads", -3), "--cpu-threads -3")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--max-context", 0), "--max-context 0")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--max-context", -1), "--max-context -1")
    one_line_error(cli("run", tiny_hf, "-p", "hi", "--record-trace", "/nonexistent/t.npy"), "/nonexistent")
    one_line_error(cli("run", tiny_hf, "-p", ""), "empty")
    one_line_error(cli("run", tiny_hf, input=""), "empty")  # like `< /dev/null`
    one_line_error(cli("convert", tiny_hf, "/proc/out"), "/proc/out")
    one_line_error(cli("serve", tiny_hf, "--port", 99999), "--port 99999")
    one_line_error(cli("profile", "--cpu-threads", 0), "--cpu-threads 0")


def test_the_context_advice_names_the_trained_length(tiny_hf):
    long = "hi " * 600  # over the tiny model's 512 trained positions
    r = cli("run", tiny_hf, "-p", long, "--raw", "--max-context", 8192, "--device", "cpu")
    one_line_error(r, "512 tokens is the model's trained length")
    assert "raise --max-context" not in r.stderr
    one_line_error(cli("run", tiny_hf, "-p", long, "--raw", "--max-context", 256, "--device", "cpu"),
                   "raise --max-context (up to 512")


@pytest.mark.parametrize("damage", ["truncated shard", "corrupt index"])
def test_serve_refuses_a_damaged_checkpoint_in_one_line(tiny_hf, tmp_path, damage):
    import socket
    ftw = tmp_path / "ftw"
    assert cli("convert", tiny_hf, ftw).exit_code == 0
    if damage == "truncated shard":
        with open(ftw / "shard-00000.ftw", "r+b") as f:
            f.truncate(4096)
    else:
        (ftw / "ftw.json").write_text("{")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "freetoken_cli.main", "serve", str(ftw), "--device", "cpu",
                          "--port", str(port), "--log-level", "warning"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr
    assert ("truncated" if damage == "truncated shard" else "corrupt") in out.stderr


def test_serve_refuses_a_port_in_use_in_one_line(tiny_hf):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        one_line_error(cli("serve", tiny_hf, "--port", s.getsockname()[1]), "already in use")


def test_bench_agent_refuses_a_session_past_the_models_context():
    """A turn past the model's context would end at its first token (no answer decoded, nothing
    for the next turn's cache to reuse): refused before the session runs."""
    one_line_error(cli("bench", "agent", "--synthetic", "tiny-hybrid", "--device", "cpu", "--system-tokens", 41000),
                   "40960", "--system-tokens")


def test_bench_agent_rows(tmp_path):
    """A hybrid model reuses checkpointed state on every turn after the first, even after the
    edits (earlier thinking dropped, old tool results cleared, the last turn's cut deepest in
    the older turns); without checkpoints nothing."""
    out = tmp_path / "agent.json"
    r = cli("bench", "agent", "--synthetic", "tiny-hybrid", "--device", "cpu", "--system-tokens", 40,
            "--response-tokens", 10, "--queries", 2, "--steps", 3, "--json", "--out", out)
    assert r.exit_code == 0, r.output
    rows, prof = json.loads(r.stdout)["rows"], json.loads(r.stdout)["profile"]
    assert rows == json.loads(out.read_text())["rows"] and len(rows) == 8
    assert prof["cpu_expert_gbps"] > 0  # the engine ran under the machine profile, as `run` does
    assert rows[0]["reuse"] == "state checkpoints" and all(r["reused_off"] == 0 for r in rows)
    assert rows[0]["reused_on"] == 0 and all(r["reused_on"] > 40 for r in rows[1:])
