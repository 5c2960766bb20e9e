"""Build FreeToken's embedded demo model: a small Qwen3-MoE trained on the Python standard library.

The model ships in ``engine/demo/model/`` (HuggingFace layout) so that ``freetoken run`` works on a
fresh machine without downloading anything. Everything is rebuilt from scratch, deterministically:

1. Data: the ``*.py`` sources of the running interpreter's standard library (sorted walk; ``test``,
   ``tests``, ``idle_test``, ``site-packages`` and files over 256 KB skipped). Files whose CRC32 of
   the relative path is 0 mod 32 (about 3 %) are held out for evaluation. Each file contributes its
   plain source plus ChatML examples built with ``ast``: for every function with a docstring the
   user asks for it (by docstring line or by name) and the assistant answers with its source.
2. Tokenizer: byte-level BPE (``tokenizers``) trained on the training split, Qwen2's pre-tokenizer
   regex, ChatML special tokens, saved through ``PreTrainedTokenizerFast`` with a chat template.
3. Model: ``Qwen3MoeForCausalLM`` (8 experts, top-2, tied embeddings) trained on the CPU with AdamW,
   a cosine schedule and the router load-balancing loss; saved in bfloat16 (safetensors).
4. Evaluation: held-out cross-entropy of the model and of an add-one-smoothed unigram baseline on
   the same held-out tokens, written to ``training_metrics.json``.

Usage: python scripts/train_demo.py --out engine/demo/model
"""

import argparse
import ast
import json
import math
import os
import random
import sysconfig
import textwrap
import time
import zlib

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

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
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
MAX_FILE_BYTES = 256 * 1024
MAX_FUNC_CHARS = 1500


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="engine/demo/model")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--moe-inter", type=int, default=256)
    p.add_argument("--chat-repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args()


def stdlib_files():
    """(relative path, text) of the stdlib's *.py files, in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for f in sorted(files):
            path = os.path.join(d, f)
            if f.endswith(".py") and os.path.getsize(path) <= MAX_FILE_BYTES:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    out.append((os.path.relpath(path, root).replace(os.sep, "/"), fh.read()))
    return out


def is_heldout(rel):
    return zlib.crc32(rel.encode()) % 32 == 0


def chat(user, assistant):
    return (f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{assistant}<|im_end|>\n")


def chat_examples(text):
    """ChatML examples (user asks for a documented function, assistant gives its source)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        src = ast.get_source_segment(text, node)
        if not doc or not src or node.name.startswith("__") or len(src) > MAX_FUNC_CHARS:
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
    """Plain source files and chat examples (repeated), each ending in <|endoftext|>."""
    docs = []
    for _, text in files:
        docs.append(text)
        docs.extend(chat_examples(text) * chat_repeats)
    return [d + "<|endoftext|>" for d in docs]


def train_tokenizer(files, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((text for _, text in files), trainer=trainer)
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
    encs = tok.backend_tokenizer.encode_batch(docs, add_special_tokens=False)
    return torch.tensor([i for e in encs for i in e.ids], dtype=torch.long)


def build_model(args, tok):
    cfg = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        moe_intermediate_size=args.moe_inter, num_experts=args.experts, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, max_position_embeddings=2048,
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


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train(model, data, args):
    gen = torch.Generator().manual_seed(args.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    n_windows = len(data) // args.seq_len
    model.train()
    t0 = time.time()
    for step in range(args.steps):
        starts = torch.randint(0, n_windows, (args.batch,), generator=gen) * args.seq_len
        x = torch.stack([data[s:s + args.seq_len] for s in starts.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        out = model(input_ids=x, labels=x, use_cache=False)  # the model shifts labels itself
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            lm = out.loss.item() - model.config.router_aux_loss_coef * out.aux_loss.item()
            el = time.time() - t0
            print(f"step {step:5d} lm_loss {lm:.4f} aux {out.aux_loss.item():.3f} "
                  f"lr {lr_at(step, args):.2e} {el:7.1f}s ({el / (step + 1):.2f}s/step)", flush=True)
    return time.time() - t0


@torch.no_grad()
def heldout_losses(model, train_ids, eval_ids, seq_len, vocab):
    """Mean cross-entropy (nats/token) of the model and of a unigram baseline on the same tokens."""
    model.eval()
    n = (len(eval_ids) // seq_len) * seq_len
    windows = eval_ids[:n].view(-1, seq_len)
    nll, count = 0.0, 0
    for i in range(0, len(windows), 16):
        x = windows[i:i + 16]
        logits = model(input_ids=x, use_cache=False).logits[:, :-1].float()
        nll += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    counts = torch.bincount(train_ids, minlength=vocab).double() + 1.0
    logp = (counts / counts.sum()).log()
    targets = windows[:, 1:].reshape(-1)
    return nll / count, -logp[targets].mean().item(), count


def sample(model, tok, prompt, max_new_tokens=120):
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    files = stdlib_files()
    train_files = [f for f in files if not is_heldout(f[0])]
    eval_files = [f for f in files if is_heldout(f[0])]
    print(f"{len(train_files)} training files, {len(eval_files)} held-out files", flush=True)

    tok = train_tokenizer(train_files, args.vocab)
    train_docs = documents(train_files, args.chat_repeats)
    random.Random(args.seed).shuffle(train_docs)
    train_ids, eval_ids = encode(tok, train_docs), encode(tok, documents(eval_files))
    print(f"{len(train_ids)} training tokens, {len(eval_ids)} held-out tokens", flush=True)

    model = build_model(args, tok)
    total, active = count_params(model)
    print(f"params: {total} total, {active} active per token", flush=True)
    train_time = train(model, train_ids, args)

    model = model.to(torch.bfloat16)
    model.config.output_router_logits = False
    heldout, unigram, n_eval = heldout_losses(model, train_ids, eval_ids, args.seq_len, len(tok))
    print(f"held-out loss {heldout:.4f} vs unigram {unigram:.4f} on {n_eval} tokens", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tok.pad_token_id, do_sample=False)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    os.chmod(os.path.join(args.out, "model.safetensors"), 0o644)  # safetensors writes 0600
    prompt = "Write a Python function that reverses a string"
    metrics = {
        "heldout_loss": round(heldout, 4), "unigram_loss": round(unigram, 4), "heldout_tokens": n_eval,
        "params": total, "active_params": active, "seed": args.seed, "steps": args.steps,
        "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr, "train_tokens": len(train_ids),
        "train_seconds": round(train_time, 1), "threads": args.threads,
        "train_files": len(train_files), "heldout_files": len(eval_files),
        "sample_prompt": prompt, "sample_output": sample(model, tok, prompt),
    }
    with open(os.path.join(args.out, "training_metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=2)
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
