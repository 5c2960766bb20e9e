"""scripts/train_demo.py at tiny scale on the CPU: the corpus file (sources, licenses, skipped and
duplicate files, the held-out rule), a demo run end to end (a model the engine loads, bits per
byte against the committed model, sampling defaults), and the routing proxy's trace, which
`--routing trace:FILE` replays."""
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parent.parent
TINY = ["--hidden", "32", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
        "--experts", "4", "--top-k", "2", "--moe-inter", "32", "--batch", "2", "--seq-len", "64", "--steps", "3",
        "--warmup", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def td():
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "scripts" / "train_demo.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_demo"] = mod  # the document builder's worker processes find its functions by name
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules["train_demo"]


def heldout_name(td, prefix):
    """A file name whose corpus key is held out."""
    return next(f"m{i}.py" for i in range(10_000) if td.is_heldout(f"{prefix}m{i}.py"))


def sdist(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {"PKG-INFO": "Metadata-Version: 2.4\nName: toypkg\nVersion: 1.0\nLicense-Expression: MIT\n",
                           **files}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"toypkg-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def corpus(td, tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    lib = d / "lib"
    (lib / "tests").mkdir(parents=True)
    (lib / "tests" / "test_x.py").write_text("assert True\n")
    code = (ROOT / "engine" / "sampling.py").read_text()
    (lib / "util.py").write_text(code)
    (lib / heldout_name(td, "")).write_text((ROOT / "engine" / "bench" / "make_trace.py").read_text())
    sdist(d / "toypkg-1.0.tar.gz", {"toypkg/core.py": (ROOT / "engine" / "moe" / "replay.py").read_text(),
                                   "toypkg/copy.py": code,  # a duplicate of the stdlib's util.py
                                   f"toypkg/{heldout_name(td, 'toypkg/toypkg/')}": (ROOT / "engine" / "errors.py").read_text(),
                                   "toypkg/_vendor/other.py": "x = 1\n", "README.md": "toy\n"})
    header = td.build_corpus(d / "corpus.jsonl.xz", [(d / "toypkg-1.0.tar.gz", "MIT")], lib)
    return d / "corpus.jsonl.xz", header


def test_corpus_file_records_sources_and_skips_tests_vendored_and_duplicates(td, corpus):
    path, header = corpus
    stdlib, toy = header["sources"]
    assert stdlib["name"] == "stdlib" and stdlib["license"] == "PSF-2.0" and stdlib["files"] == 2
    assert toy["name"] == "toypkg" and toy["version"] == "1.0" and toy["license"] == toy["license_metadata"] == "MIT"
    assert toy["files"] == 2 and len(toy["sha256"]) == 64
    again, files = td.read_corpus(path)
    assert again == header and len(files) == header["files"] == 4
    keys = [k for k, _ in files]
    assert "util.py" in keys and "toypkg/toypkg/core.py" in keys and "toypkg/toypkg/copy.py" not in keys
    assert sum(td.is_heldout(k) for k in keys) == 2
    assert td.is_heldout("xml/sax/saxutils.py")  # the standard library's held-out files are the same as before


def test_chat_examples_match_the_parsers_source_segments(td):
    import ast
    import textwrap
    text = 'class A:\r\n    def f(self, x):\n        """Return x.\n\n        More."""\n        return "\u00e9" + x  # done\n'
    node = ast.parse(text).body[0].body[0]
    (example,) = td.chat_examples(text)
    assert example.endswith("assistant\n" + textwrap.dedent("    " + ast.get_source_segment(text, node)) + "<|im_end|>\n")
    assert '"\u00e9" + x<|im_end|>' in example


@pytest.fixture(scope="module")
def demo(td, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    grid = td.PROMPTS, td.TEMPERATURES
    td.PROMPTS, td.TEMPERATURES = td.PROMPTS[:1], (0.0, 0.8)  # the sampling search, smaller
    try:
        td.main(["demo", "--corpus", str(corpus[0]), "--out", str(out), "--baseline", str(ROOT / "engine/demo/model"),
                 "--vocab", "300", *TINY])
    finally:
        td.PROMPTS, td.TEMPERATURES = grid
    return out


def test_demo_run_saves_a_model_the_engine_loads(demo):
    """The saved model scores and samples, and the engine's greedy tokens on it are transformers'."""
    import torch
    from conftest import greedy, load
    from transformers import AutoModelForCausalLM

    from engine.resolve import ensure_ftw
    m = json.loads((demo / "training_metrics.json").read_text())
    assert m["steps"] == 3 and m["train_files"] == 2 and m["heldout_files"] == 2
    assert 0 < m["heldout_bpb"] and 0 < m["unigram_bpb"] and 0 < m["baseline_bpb"]
    assert [s["name"] for s in m["corpus"]] == ["stdlib", "toypkg"]
    gen = json.loads((demo / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0] and m["temperature"] in (0.0, 0.8)
    assert gen.get("temperature", 0.0) == m["temperature"] and gen.get("top_k", 0) == 0
    assert list(m["samples"]) == ["Write a function that reverses a string"]  # the first answer per prompt
    assert all(f.stat().st_size < 16 << 20 for f in demo.glob("*.safetensors"))
    prompt = [1, 40, 41, 42, 43]
    ref = AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32).eval()
    want = ref.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False, min_new_tokens=4)[0, 5:].tolist()
    assert greedy(load(ensure_ftw(str(demo))), prompt, 4) == want


def test_proxy_trace_replays_and_reports_the_predictor(td, corpus, demo, tmp_path):
    from engine.moe.replay import make_routing
    td.main(["proxy", "--corpus", str(corpus[0]), "--tokenizer", str(demo), "--out", str(tmp_path), *TINY,
             "--layers", "3", "--experts", "8", "--trace-tokens", "128"])
    trace = np.load(tmp_path / "routing_trace.npy")
    assert trace.shape == (128, 3, 2) and trace.dtype == np.int16 and 0 <= trace.min() and trace.max() < 8
    assert all(len(set(row)) == 2 for row in trace.reshape(-1, 2).tolist())  # top-2: distinct experts
    replay = make_routing(f"trace:{tmp_path / 'routing_trace.npy'}", 3, 8, 2)
    import torch
    assert replay(0, torch.zeros(1, 2, dtype=torch.long)).tolist() == [trace[0, 0].tolist()]
    m = json.loads((tmp_path / "proxy_metrics.json").read_text())
    assert len(m["predicted_share"]) == 2 and all(0 <= s <= 1 for s in m["predicted_share"])
    assert 0 <= m["reuse_prev_token"] <= 1 and 0 < m["top_eighth_share"] <= 1 and m["steps"] == 3


def test_train_until_ends_training_by_the_clock(td, corpus, tmp_path):
    """A budget already spent: no step runs, and the schedule is past its end."""
    args = td.parse_args(["demo", "--out", str(tmp_path), "--train-until", "0", "--vocab", "300", *TINY])
    import torch
    model = td.build_model(args, td.train_tokenizer(["def f():\n    return 1\n"] * 4, 300))
    steps, _ = td.train(model, torch.zeros(1000, dtype=torch.long), args, torch.device("cpu"))
    assert steps == 0
    assert td.lr_at(10, 1.0, args) == pytest.approx(0.1 * args.lr)


def test_loop_checks(td):
    assert td.distinct_4gram_ratio([1, 2, 3, 4] * 10) < 0.2 and td.distinct_4gram_ratio(list(range(20))) == 1
    assert td.parses("def f():\n    return 1\nx = (", finished=False)
    assert not td.parses("def f():\n    return 1\nx = (", finished=True)
