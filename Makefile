# Two set-up commands: `make run` (chat with the embedded demo model) and `make test`.
# Both create .venv on first use. Without an NVIDIA GPU the CPU build of torch is installed
# first, so pip never pulls the multi-GB CUDA build; with one, pip takes the normal CUDA build and
# the `cuda` extra (flash-linear-attention's kernels for the hybrid models).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: run test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		echo "no NVIDIA GPU found: installing the CPU build of torch"; \
		$(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e ".[test$$(command -v nvidia-smi >/dev/null 2>&1 && echo ,cuda)]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/freetoken run $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -x --durations=15 $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
