"""The CLI with bench decode's streams sampling as a model's defaults do (temperature 0.7, top-k 20,
top-p 0.8, repetition penalty 1.05) instead of greedily. Usage: python3 sampled.py bench decode ..."""
import functools
import engine.bench.decode as D
from engine.config import SamplingParams
D.SamplingParams = functools.partial(SamplingParams, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
from freetoken_cli.main import app
app(prog_name="freetoken")
