"""Build FreeToken's embedded demo model, and a routing proxy of a real MoE's expert shape, from one
corpus of Python source.

  corpus  download the pinned sdists of PACKAGES with pip and write them, with this interpreter's
          standard library, into one corpus file (JSON lines, xz): a header naming each source's
          version, license and sdist hash, then one record per ``*.py`` file.
  demo    train the embedded demo model (``engine/demo/model``, HuggingFace layout) on the corpus:
          byte-level BPE tokenizer, ``Qwen3MoeForCausalLM``, held-out bits per byte against the
          model it replaces and a unigram baseline, and sampling defaults chosen on the README's
          prompts, written to ``generation_config.json``.
  proxy   train a ``Qwen3MoeForCausalLM`` with Qwen3-30B-A3B's expert shape on the same corpus (the
          demo's tokenizer), then record its routing trace on held-out text (the ``.npy`` that
          ``--routing trace:FILE`` replays) and the cross-layer predictor's accuracy
          (``engine.bench.prefetch_accuracy``).

Data (both models): every file of the corpus is a document; files whose CRC32 of their key (the
path under the standard library, or ``package/path`` in an sdist) is 0 mod 32 are held out. Each
document is the plain source plus ChatML examples built with ``ast``: for every function with a
docstring the user asks for it (by docstring line or by name) and the assistant answers with its
source. Without ``--corpus`` the running interpreter's standard library is the corpus.

Training runs ``--steps`` steps or until ``--train-until`` seconds after the script started,
whichever comes first; the learning-rate schedule follows the larger of the two fractions, so a run
cut by time still anneals, and a device job knows when it ends whatever its data preparation took.
See engine/demo/TRAINING.md for the recipe and benchmarks/h200.sh (part ``train``) for the device run.

Usage: python scripts/train_demo.py corpus --out .probe/train/corpus.jsonl.xz
       python scripts/train_demo.py demo --corpus .probe/train/corpus.jsonl.xz --out engine/demo/model
       python scripts/train_demo.py proxy --corpus ... --tokenizer engine/demo/model --out DIR
"""

import time

START = time.time()  # --train-until counts from here, before the heavy imports

import argparse
import ast
import contextlib
import email
import hashlib
import json
import lzma
import math
import multiprocessing
import os
import random
import re
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# test suites and other projects' vendored copies (their licenses are not the package's) are skipped
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "_vendor", "vendor", "_vendored"}
MAX_FILE_BYTES = 256 * 1024
MAX_FUNC_CHARS = 1500
TOKENIZER_BYTES = 32 << 20  # the tokenizer learns from every k-th training file, about this much text
# Well-known Python projects under permissive licenses, (PyPI name, version, SPDX license as the
# project states it); only their Python source is taken (some ship optional C accelerators). The
# sdist's own metadata is recorded beside the license in the corpus header.
PACKAGES = [
    ("aiohttp", "3.14.5", "Apache-2.0 AND MIT"), ("alembic", "1.20.1", "MIT"), ("anyio", "4.16.0", "MIT"),
    ("arrow", "1.4.0", "Apache-2.0"), ("attrs", "26.1.0", "MIT"), ("babel", "2.19.0", "BSD-3-Clause"),
    ("beautifulsoup4", "4.15.0", "MIT"), ("black", "26.10.1", "MIT"), ("celery", "5.7.0", "BSD-3-Clause"),
    ("charset-normalizer", "3.5.3", "MIT"), ("click", "8.5.1", "BSD-3-Clause"), ("coverage", "7.17.5", "Apache-2.0"),
    ("dask", "2026.8.0", "BSD-3-Clause"), ("django", "5.2.19", "BSD-3-Clause"), ("fastapi", "0.165.0", "MIT"),
    ("flake8", "7.5.0", "MIT"), ("flask", "3.1.3", "BSD-3-Clause"), ("gunicorn", "27.0.1", "MIT"),
    ("httpcore", "1.0.9", "BSD-3-Clause"), ("httpx", "0.28.1", "BSD-3-Clause"), ("idna", "3.20", "BSD-3-Clause"),
    ("ipython", "9.18.1", "BSD-3-Clause"), ("isort", "9.0.2", "MIT"), ("jinja2", "3.1.6", "BSD-3-Clause"),
    ("jsonschema", "4.26.0", "MIT"), ("kombu", "5.7.0", "BSD-3-Clause"), ("markdown", "3.11.3", "BSD-3-Clause"),
    ("marshmallow", "4.4.0", "MIT"), ("more-itertools", "11.2.1", "MIT"), ("mpmath", "1.4.1", "BSD-3-Clause"),
    ("mypy", "2.4.1", "MIT"), ("networkx", "3.6.1", "BSD-3-Clause"), ("packaging", "26.4", "Apache-2.0 OR BSD-2-Clause"),
    ("peewee", "4.5.3", "MIT"), ("pip", "26.3", "MIT"), ("prompt-toolkit", "3.0.53", "BSD-3-Clause"),
    ("pydantic", "2.14.4", "MIT"), ("pygments", "2.21.0", "BSD-2-Clause"), ("pyparsing", "3.3.3", "MIT"),
    ("pytest", "9.2.0", "MIT"), ("python-dateutil", "4.0.0", "BSD-3-Clause"), ("pyyaml", "6.0.4", "MIT"),
    ("redis", "8.1.0", "MIT"), ("requests", "2.34.2", "Apache-2.0"), ("rich", "15.0.0", "MIT"),
    ("scrapy", "2.19.0", "BSD-3-Clause"), ("setuptools", "84.2.1", "MIT"), ("sphinx", "9.0.4", "BSD-2-Clause"),
    ("sqlalchemy", "2.1.9", "MIT"), ("sqlparse", "0.6.1", "BSD-3-Clause"), ("starlette", "1.10.0", "BSD-3-Clause"),
    ("sympy", "1.14.0", "BSD-3-Clause"), ("toolz", "1.2.0", "BSD-3-Clause"), ("tornado", "6.6.1", "Apache-2.0"),
    ("traitlets", "5.16.1", "BSD-3-Clause"), ("twisted", "26.10.0", "MIT"), ("typer", "0.29.2", "MIT"),
    ("urllib3", "2.8.0", "MIT"), ("werkzeug", "3.1.9", "BSD-3-Clause"), ("xarray", "2026.9.0", "Apache-2.0"),
]
# The README's example prompts (the second pipes a file after "explain"), and a docstring-style one;
# the sampling defaults are chosen on these
PROMPTS = [
    "Write a function that reverses a string",
    "explain\n\ndef mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n",
    "Return the number of items in the queue.",
]
TEMPERATURES = (0.0, 0.4, 0.6, 0.8, 1.0)
MODES = {  # per mode: sizes and optimisation defaults
    "demo": dict(vocab=8192, hidden=384, layers=6, heads=6, kv_heads=2, head_dim=64, experts=8, top_k=2,
                 moe_inter=160, steps=6000, batch=64, seq_len=1024, lr=2e-3, warmup=200),
    "proxy": dict(hidden=2048, layers=8, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8, moe_inter=768,
                  steps=800, batch=16, seq_len=1024, lr=6e-4, warmup=30),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("corpus", help="download the sdists and write the corpus file")
    c.add_argument("--out", required=True)
    c.add_argument("--sdists", default=".probe/train/sdists", help="download directory (kept between runs)")
    g = sub.add_parser("sampling", help="choose the repetition penalty of the shipped model with FreeToken's engine")
    g.add_argument("--model", default="engine/demo/model")
    for mode, d in MODES.items():
        m = sub.add_parser(mode)
        m.add_argument("--out", required=True)
        m.add_argument("--corpus", help="corpus file (default: the running interpreter's standard library)")
        m.add_argument("--device", default="cpu")
        m.add_argument("--train-until", type=float, default=float("inf"),
                       help="end training this many seconds after the script started")
        m.add_argument("--seed", type=int, default=0)
        m.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
        for k, v in d.items():
            m.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
        if mode == "demo":
            m.add_argument("--chat-repeats", type=int, default=2)
            m.add_argument("--baseline", default=None, help="the model being replaced, scored in bits per byte")
        else:
            m.add_argument("--tokenizer", required=True, help="directory of the demo model whose tokenizer to use")
            m.add_argument("--trace-tokens", type=int, default=8192, help="held-out tokens in the routing trace")
    return p.parse_args(argv)


# --- corpus -------------------------------------------------------------------------------------

def skipped(rel: str, size: int) -> bool:
    parts = rel.split("/")
    return not rel.endswith(".py") or size > MAX_FILE_BYTES or any(d in SKIP_DIRS for d in parts[:-1])


def source_files(root):
    """(relative path, text) of the *.py files under root, in a fixed order."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for f in sorted(files):
            path = os.path.join(d, f)
            if not skipped(f, os.path.getsize(path)):
                with open(path, encoding="utf-8", errors="replace") as fh:
                    out.append((os.path.relpath(path, root).replace(os.sep, "/"), fh.read()))
    return out


def stdlib_files():
    return source_files(sysconfig.get_paths()["stdlib"])


def sdist_files(path):
    """(PKG-INFO headers, [(path inside the project, text)]) of an sdist .tar.gz, in name order."""
    meta, out = None, []
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            rel = m.name.partition("/")[2]
            if rel == "PKG-INFO":
                meta = email.message_from_bytes(tar.extractfile(m).read())
            elif m.isfile() and not skipped(rel, m.size):
                out.append((rel, tar.extractfile(m).read().decode("utf-8", errors="replace")))
    if meta is None:
        raise SystemExit(f"{path} has no PKG-INFO; is it an sdist?")
    return meta, out


def metadata_license(meta) -> str:
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return meta.get("License-Expression") or "; ".join(classifiers) or (meta.get("License") or "").split("\n")[0]


def build_corpus(out, sdists, stdlib_root):
    """Write the corpus: the standard library under stdlib_root, then each (sdist, license), files
    deduplicated by content (the first copy stays). Returns the header."""
    sources, records, seen = [], [], set()

    def add(source, files):
        n = size = 0
        for key, text in files:
            digest = hashlib.sha1(text.encode()).digest()
            if digest not in seen:
                seen.add(digest)
                records.append({"source": source, "path": key, "text": text})
                n, size = n + 1, size + len(text.encode())
        return n, size

    n, size = add("stdlib", source_files(stdlib_root))
    sources.append({"name": "stdlib", "version": sys.version.split()[0], "license": "PSF-2.0",
                    "origin": "CPython standard library", "files": n, "bytes": size})
    for path, license_ in sdists:
        meta, files = sdist_files(path)
        name = meta["Name"]
        n, size = add(name, [(f"{name}/{rel}", text) for rel, text in files])
        sources.append({"name": name, "version": meta["Version"], "license": license_,
                        "license_metadata": metadata_license(meta), "origin": Path(path).name,
                        "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(), "files": n, "bytes": size})
    header = {"sources": sources, "files": len(records), "bytes": sum(s["bytes"] for s in sources)}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(out, "wt", encoding="utf-8", preset=9) as fh:
        fh.write(json.dumps(header) + "\n")
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return header


def download_sdists(directory):
    """[(sdist path, license)] of PACKAGES, downloaded with pip into directory unless already there."""
    directory = Path(directory)
    out = []
    for name, version, license_ in PACKAGES:
        path = directory / f"{re.sub(r'[-_.]+', '_', name)}-{version}.tar.gz"  # the sdist name (PEP 625)
        if not path.exists() and subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                                                 "--no-binary", name, "-d", str(directory), f"{name}=={version}"]).returncode:
            raise SystemExit(f"pip could not download the sdist of {name}=={version}; check the package index")
        out.append((path, license_))
    return out


def read_corpus(path):
    """(header, [(key, text)]) of a corpus file."""
    with lzma.open(path, "rt", encoding="utf-8") as fh:
        header = json.loads(fh.readline())
        return header, [(r["path"], r["text"]) for r in map(json.loads, fh)]


def is_heldout(key):
    return zlib.crc32(key.encode()) % 32 == 0


# --- documents and tokenizer --------------------------------------------------------------------

def chat(user, assistant):
    return (f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{assistant}<|im_end|>\n")


def source_lines(text):
    r"""text split as the parser counts lines (only \r\n, \r and \n end one), ends kept."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)


def chat_examples(text):
    """ChatML examples (user asks for a documented function, assistant gives its source)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    lines = source_lines(text)  # ast.get_source_segment would split the whole text again per function
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("__"):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            continue
        seg = lines[node.lineno - 1:node.end_lineno]
        seg[-1] = seg[-1].encode()[:node.end_col_offset].decode(errors="replace")
        seg[0] = seg[0].encode()[node.col_offset:].decode(errors="replace")
        src = "".join(seg)
        if len(src) > MAX_FUNC_CHARS:
            continue
        src = textwrap.dedent(" " * node.col_offset + src)
        line = doc.strip().split("\n")[0].strip()
        kind = zlib.crc32(node.name.encode()) % 3
        if kind == 0 and len(line) > 8:
            user = line
        elif kind == 1 and len(line) > 8:
            user = f"Write a Python function named {node.name}: {line}"
        else:
            user = f"Write a Python function named {node.name}."
        out.append(chat(user, src))
    return out


def documents(files, chat_repeats=1):
    """Plain source files and chat examples (repeated), each ending in <|endoftext|>; the examples
    are parsed in one process per core."""
    texts = [text for _, text in files]
    with ProcessPoolExecutor(min(os.cpu_count(), 32), mp_context=multiprocessing.get_context("fork")) as ex:
        chats = list(ex.map(chat_examples, texts, chunksize=16))
    docs = []
    for text, examples in zip(texts, chats):
        docs.append(text)
        docs.extend(examples * chat_repeats)
    return [d + "<|endoftext|>" for d in docs]


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    # <think> and </think> stay whole tokens but are not "special", as in Qwen3: decoding with
    # skip_special_tokens keeps them, so reasoning parsers can see them
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in SPECIALS[3:]])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens=SPECIALS[1:2], clean_up_tokenization_spaces=False,
        model_max_length=2048, split_special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode(tok, docs):
    """Token ids of the concatenated documents (int64), encoded in chunks to bound memory."""
    parts = []
    for i in range(0, len(docs), 1024):
        for e in tok.backend_tokenizer.encode_batch(docs[i:i + 1024], add_special_tokens=False):
            parts.append(np.asarray(e.ids, dtype=np.int64))
    return torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.long)


def prepare(args, tok=None):
    """(tokenizer, training ids, held-out documents, held-out ids, corpus header); trains the
    tokenizer on the training split unless one is given."""
    t0 = time.time()
    if args.corpus:
        header, files = read_corpus(args.corpus)
    else:
        header, files = {"sources": [{"name": "stdlib", "version": sys.version.split()[0]}]}, stdlib_files()
    train_files = [f for f in files if not is_heldout(f[0])]
    eval_files = [f for f in files if is_heldout(f[0])]
    header.update(train_files=len(train_files), heldout_files=len(eval_files))
    log(f"{len(train_files)} training files, {len(eval_files)} held-out files", t0)
    train_docs = documents(train_files, getattr(args, "chat_repeats", 1))  # forks: before the tokenizer's threads
    random.Random(args.seed).shuffle(train_docs)
    eval_docs = documents(eval_files)
    if tok is None:
        k = max(1, sum(len(text) for _, text in train_files) // TOKENIZER_BYTES)
        tok = train_tokenizer([text for _, text in train_files[::k]], args.vocab)
        log(f"tokenizer: {len(tok)} tokens", t0)
    train_ids, eval_ids = encode(tok, train_docs), encode(tok, eval_docs)
    log(f"{len(train_ids)} training tokens, {len(eval_ids)} held-out tokens", t0)
    return tok, train_ids, eval_docs, eval_ids, header


def log(msg, t0=None):
    print(msg + (f" ({time.time() - t0:.1f}s)" if t0 is not None else ""), flush=True)


# --- model and training -------------------------------------------------------------------------

def build_model(args, tok):
    cfg = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, moe_intermediate_size=args.moe_inter, num_experts=args.experts,
        num_experts_per_tok=args.top_k, norm_topk_prob=True, decoder_sparse_step=1, max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        output_router_logits=True, router_aux_loss_coef=0.01, initializer_range=0.02,
        bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    return Qwen3MoeForCausalLM(cfg)


def count_params(model):
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = total - expert + expert * cfg.num_experts_per_tok // cfg.num_experts
    return total, active


def lr_at(step, frac, args):
    """Linear warmup over args.warmup steps, then cosine decay to 10% over the run's fraction frac."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def autocast(device):
    """bfloat16 autocast on CUDA; the CPU (tests, the CPU recipe) trains in the parameters' dtype."""
    return torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def train(model, data, args, device):
    """AdamW with the router load-balancing loss on random aligned windows of data; stops after
    args.steps or at args.train_until. Returns (steps done, seconds)."""
    gen = torch.Generator(device).manual_seed(args.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    data = data.to(device)
    n_windows = len(data) // args.seq_len
    offsets = torch.arange(args.seq_len, device=device)
    model.train()
    t0, step = time.time(), 0
    budget = START + args.train_until - t0
    while (frac := max(step / args.steps, (time.time() - t0) / budget if budget > 0 else 1.0)) < 1:
        starts = torch.randint(0, n_windows, (args.batch, 1), generator=gen, device=device) * args.seq_len
        x = data[starts + offsets]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, frac, args)
        with autocast(device):
            out = model(input_ids=x, labels=x, use_cache=False)  # the model shifts labels itself
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            lm = out.loss.item() - model.config.router_aux_loss_coef * out.aux_loss.item()
            el = time.time() - t0
            log(f"step {step:5d} lm_loss {lm:.4f} aux {out.aux_loss.item():.3f} lr {lr_at(step, frac, args):.2e} "
                f"{el:7.1f}s ({el / (step + 1):.3f}s/step)")
        step += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    log(f"{step} steps", t0)
    return step, time.time() - t0


# --- evaluation ---------------------------------------------------------------------------------

@torch.no_grad()
def total_nll(model, ids, window, device, batch=32):
    """Summed cross-entropy (nats) of every token after the first, in windows of `window` tokens
    that overlap by one (each window's first token is the previous one's last target)."""
    model.eval()
    step = window - 1
    n = (len(ids) - 1) // step
    nll = 0.0
    for i in range(0, n + 1, batch):
        rows = [ids[s:s + window] for s in range(i * step, min(n + 1, i + batch) * step, step)]
        rows = [r for r in rows if len(r) > 1]
        if not rows:
            break
        width = max(len(r) for r in rows)
        x = torch.stack([torch.nn.functional.pad(r, (0, width - len(r)), value=-100) for r in rows]).to(device)
        with autocast(device):
            logits = model(input_ids=x.clamp(min=0), use_cache=False).logits[:, :-1].float()
        nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                                                 ignore_index=-100, reduction="sum").item()
    return nll


def unigram_nll(train_ids, eval_ids, vocab):
    """Summed cross-entropy (nats) of eval_ids[1:] under add-one-smoothed training counts."""
    counts = torch.bincount(train_ids, minlength=vocab).double() + 1.0
    return -(counts / counts.sum()).log()[eval_ids[1:]].sum().item()


def bits_per_byte(nll, text):
    return nll / math.log(2) / len(text.encode())


def baseline_bpb(path, text, device):
    """Bits per byte of a saved model on text, with its own tokenizer, in windows of its training length."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device)
    with open(os.path.join(path, "training_metrics.json")) as fh:
        window = json.load(fh)["seq_len"]
    ids = torch.tensor(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)
    return bits_per_byte(total_nll(model, ids, window, device), text)


def distinct_4gram_ratio(ids):
    grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
    return len(set(grams)) / len(grams) if grams else 1.0


def parses(text, finished):
    """An answer is Python up to its last complete line (all of it when it ended by itself)."""
    try:
        ast.parse(text if finished else text[:text.rfind("\n") + 1])
        return True
    except (SyntaxError, ValueError):
        return False


@torch.no_grad()
def sampling_scores(model, tok, device, samples=8, max_new_tokens=160):
    """Per temperature in TEMPERATURES (top_p 0.95): the share of answers to PROMPTS (samples
    each) whose distinct 4-gram ratio is >= 0.6 and that parse as Python (`parses`), and the first
    answer to each prompt."""
    model.eval()
    eos = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in PROMPTS]
    enc = tok([t for t in texts for _ in range(samples)], return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False).to(device)
    scores, answers = {}, {}
    for t in TEMPERATURES:
        torch.manual_seed(0)
        kw = dict(do_sample=True, temperature=t, top_p=0.95, top_k=0) if t else dict(do_sample=False)
        with autocast(device):
            out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                 eos_token_id=sorted(eos), **kw)
        ok, texts = 0, []
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            end = next((i for i, x in enumerate(row) if x in eos), None)
            texts.append(tok.decode(row[:end], skip_special_tokens=True))
            ok += distinct_4gram_ratio(row[:end]) >= 0.6 and parses(texts[-1], end is not None)
        scores[t], answers[t] = ok / len(out), texts[::samples]
        log(f"temperature {t}: {scores[t]:.2f} of answers pass")
    return scores, answers


def generation_config(tok, temperature):
    """Stop on <|im_end|> and <|endoftext|>; sample at temperature with top-p 0.95 (0: greedy)."""
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    sampling = dict(do_sample=True, temperature=temperature, top_p=0.95, top_k=0) if temperature else {}
    return GenerationConfig(eos_token_id=eos, pad_token_id=tok.pad_token_id, **sampling)


PENALTIES = (1.0, 1.05, 1.1, 1.15, 1.2, 1.3)


def choose_penalty(path):
    """Greedy answers to PROMPTS (160 tokens at most) from the model as shipped, through FreeToken's
    engine on the CPU, for each repetition penalty in PENALTIES; the smallest with every answer
    passing (distinct 4-gram ratio >= 0.6, parses as Python) goes to generation_config.json and
    training_metrics.json. The device's choice of temperature ran transformers on the fp32 weights
    before the bfloat16 cast, where greedy answers did not loop; on the shipped weights they can."""
    from engine.config import EngineConfig, SamplingParams
    from engine.llm import LLM
    from engine.scheduler import Scheduler, Sequence
    llm = LLM(EngineConfig(model=path, device="cpu"))
    tok, rates = llm.tokenizer, {}
    for pen in PENALTIES:
        ok = 0
        for prompt in PROMPTS:
            seq = Sequence(tok.chat([{"role": "user", "content": prompt}]),
                           SamplingParams(max_tokens=160, repetition_penalty=pen))
            sched = Scheduler(llm.runner, tok.eos_ids, 1, 2048, prefix_cache=False)
            sched.add(seq)
            while not seq.finish:
                sched.step()
            out = [t for t in seq.output if t not in tok.eos_ids]
            ok += distinct_4gram_ratio(out) >= 0.6 and parses(tok.decode(out), seq.finish == "stop")
        rates[pen] = ok / len(PROMPTS)
        log(f"repetition penalty {pen}: {rates[pen]:.2f} of answers pass")
    pen = min((p for p in PENALTIES if rates[p] == 1.0), default=max(rates, key=rates.get))
    for name in ("generation_config.json", "training_metrics.json"):
        f = os.path.join(path, name)
        d = json.load(open(f))
        d.update({"repetition_penalty": pen} if name.startswith("gen") else {"repetition_penalty_pass_rate": rates,
                                                                           "repetition_penalty": pen})
        with open(f, "w") as fh:
            json.dump(d, fh, indent=2)
    print(f"repetition penalty {pen} (pass rates {rates})")


# --- routing proxy ------------------------------------------------------------------------------

@torch.no_grad()
def routing_trace(model, ids, tokens, window, device):
    """Route `tokens` held-out tokens (windows of `window`): the trace [tokens, layers, top_k] int16
    and each layer's MoE input [tokens, hidden] (for the cross-layer predictor)."""
    model.eval()
    gates = [layer.mlp.gate for layer in model.model.layers]
    seen = [([], []) for _ in gates]

    def keep(s):
        def hook(module, args, out):  # out: router logits, top-k weights, top-k ids
            s[0].append(args[0].reshape(-1, args[0].shape[-1]))
            s[1].append(out[2])
        return hook
    hooks = [g.register_forward_hook(keep(s)) for g, s in zip(gates, seen)]
    try:
        x = ids[:tokens - tokens % window].view(-1, window).to(device)
        for i in range(0, len(x), 8):
            with autocast(device):
                model(input_ids=x[i:i + 8], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    trace = torch.stack([torch.cat(s[1]) for s in seen], dim=1).to("cpu", torch.int16)
    return trace, [torch.cat(s[0]) for s in seen]


def trace_stats(trace, experts):
    """Locality of a trace: the share of a token's experts also routed for the previous token, and
    the share of routings that the 1/8 most used experts of each layer take."""
    t = trace.long()
    reuse = (t[1:, :, :, None] == t[:-1, :, None, :]).any(-1).float().mean().item()
    counts = torch.stack([torch.bincount(t[:, layer].reshape(-1), minlength=experts) for layer in range(t.shape[1])])
    top = counts.sort(dim=1, descending=True).values[:, :max(1, experts // 8)].sum().item()
    return {"reuse_prev_token": round(reuse, 4), "top_eighth_share": round(top / counts.sum().item(), 4)}


def run_proxy(args, device):
    from engine.bench.prefetch_accuracy import predicted_share
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    tok, train_ids, _, eval_ids, header = prepare(args, tok)
    t0 = time.time()
    with torch.device(device):
        model = build_model(args, tok).to(torch.bfloat16)  # pure bfloat16: weights and AdamW state
    total, active = count_params(model)
    log(f"params: {total} total, {active} active per token", t0)
    steps, seconds = train(model, train_ids, args, device)
    trace, inputs = routing_trace(model, eval_ids, args.trace_tokens, args.seq_len, device)
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "routing_trace.npy"), trace.numpy())
    with torch.no_grad():
        share = predicted_share(inputs, lambda layer, x: model.model.layers[layer].mlp.gate(x)[2])
    n_layers = trace.shape[1]
    nll = total_nll(model, eval_ids[:args.trace_tokens], args.seq_len, device)
    metrics = {
        "trace": "routing_trace.npy", "trace_shape": list(trace.shape), "experts": args.experts, "top_k": args.top_k,
        "hidden": args.hidden, "moe_inter": args.moe_inter, "layers": n_layers, "params": total, "active_params": active,
        "predicted_share": [round(s, 4) for s in share],
        "predicted_share_mean": round(sum(share) / len(share), 4) if share else None,
        **trace_stats(trace, args.experts), "heldout_loss": round(nll / (min(len(eval_ids), args.trace_tokens) - 1), 4),
        "steps": steps, "train_seconds": round(seconds, 1), "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
        "train_tokens": len(train_ids), "tokens_seen": steps * args.batch * args.seq_len, "seed": args.seed,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "corpus_files": header.get("files"),
    }
    with open(os.path.join(args.out, "proxy_metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=2)
    print(json.dumps(metrics, indent=2))


def run_demo(args, device):
    tok, train_ids, eval_docs, eval_ids, header = prepare(args)
    model = build_model(args, tok).to(device)
    total, active = count_params(model)
    log(f"params: {total} total, {active} active per token")
    steps, seconds = train(model, train_ids, args, device)

    model = model.to(torch.bfloat16)  # scored as shipped
    model.config.output_router_logits = False
    model.generation_config = generation_config(tok, 0.0)
    model.save_pretrained(args.out, max_shard_size="15MB")  # shards under 16 MiB; saved before the evaluation
    tok.save_pretrained(args.out)
    for f in Path(args.out).glob("*.safetensors"):
        f.chmod(0o644)  # safetensors writes 0600
    t0 = time.time()
    eval_text = "".join(eval_docs)
    nll = total_nll(model, eval_ids, args.seq_len, device)
    uni = unigram_nll(train_ids, eval_ids, len(tok))
    n = len(eval_ids) - 1
    metrics = {
        "heldout_loss": round(nll / n, 4), "unigram_loss": round(uni / n, 4), "heldout_tokens": n,
        "heldout_bytes": len(eval_text.encode()), "heldout_bpb": round(bits_per_byte(nll, eval_text), 4),
        "unigram_bpb": round(bits_per_byte(uni, eval_text), 4),
    }
    if args.baseline:
        metrics["baseline_bpb"] = round(baseline_bpb(args.baseline, eval_text, device), 4)
    log(f"held-out: {metrics}", t0)
    scores, answers = sampling_scores(model, tok, device)
    temperature = min(scores, key=lambda t: (-scores[t], t))  # the most passing answers, then the coolest
    generation_config(tok, temperature).save_pretrained(args.out)
    metrics.update({
        "params": total, "active_params": active, "seed": args.seed, "steps": steps, "batch": args.batch,
        "seq_len": args.seq_len, "lr": args.lr, "warmup": args.warmup, "train_tokens": len(train_ids),
        "tokens_seen": steps * args.batch * args.seq_len, "train_seconds": round(seconds, 1),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({args.threads} threads)",
        "train_files": header["train_files"], "heldout_files": header["heldout_files"],
        "corpus": [{k: s.get(k) for k in ("name", "version", "license")} for s in header["sources"]],
        "sampling_pass_rate": {str(t): s for t, s in scores.items()}, "temperature": temperature, "top_p": 0.95,
        "samples": dict(zip(PROMPTS, answers[temperature])),
    })
    with open(os.path.join(args.out, "training_metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=2)
    print(json.dumps({k: v for k, v in metrics.items() if k != "corpus"}, indent=2))


def main(argv=None):
    args = parse_args(argv)
    if args.mode == "corpus":
        header = build_corpus(args.out, download_sdists(args.sdists), sysconfig.get_paths()["stdlib"])
        for s in header["sources"]:
            print(f"{s['name']:20s} {s['version']:10s} {s['license']:28s} {s['files']:5d} files {s['bytes']:>10,} bytes"
                  f"  (metadata: {s.get('license_metadata', '-')})")
        print(f"{header['files']} files, {header['bytes']:,} bytes -> {args.out} ({os.path.getsize(args.out):,} bytes)")
        return
    if args.mode == "sampling":
        return choose_penalty(args.model)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 grouped-GEMM fallback of the demo's experts
    (run_demo if args.mode == "demo" else run_proxy)(args, device)


if __name__ == "__main__":
    main()
