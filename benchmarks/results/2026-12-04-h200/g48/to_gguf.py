"""llama.cpp's convert_hf_to_gguf.py on a random-weight checkpoint that carries the demo tokenizer: the
converter only knows released tokenizers' pre-tokenizer hashes, so the check is answered with qwen2's
(the weights are random; llama-bench never tokenizes text). Usage: to_gguf.py LLAMA_CPP_DIR HF_DIR OUT.gguf"""
import sys
from pathlib import Path

src, hf, out = sys.argv[1:4]
sys.path.insert(0, src)
sys.path.insert(1, str(Path(src) / "gguf-py"))
import conversion.base as base  # noqa: E402

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = ["convert_hf_to_gguf.py", hf, "--outfile", out, "--outtype", "bf16"]
import convert_hf_to_gguf  # noqa: E402

convert_hf_to_gguf.main()
