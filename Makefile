# kimipipe: set-up, tests, the offline demo, and full dataset builds.
#
#   make demo                 the whole pipeline offline (stand-in + bundled tokenizer)
#   make test                 the test suite          make lint    ruff
#   make all                  every dataset: prompts -> responses -> tokens -> shards
#   make B3.tokens            rerun one stage of one dataset from the saved files
#   make credits              the account's balance
#
# Every target that needs the package creates the virtual environment when it is missing.
# A build is resumable: rerun `make all` after a crash, a Ctrl-C or a budget stop. Each
# stage leaves a stamp file (WORK/<D>.<stage>.done) only when it finished, so an unfinished
# responses file is resumed by kp-infer, never mistaken for a finished one.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Test processes (pytest-xdist). Most tests wait on subprocesses and sockets, so more
# processes than cores keeps both cores of a small machine busy.
PYTEST_JOBS ?= 4

# --- what to build -----------------------------------------------------------------------
DATASETS ?= B3 B4 B5 B6 B7 B8
SOURCES ?= sources
# A dataset's source: SOURCE_<D> if set, else $(SOURCES)/<D>.json
source = $(or $(SOURCE_$(1)),$(SOURCES)/$(1).json)
WORK ?= work
SHARDS ?= shards

# --- the flags users tune ----------------------------------------------------------------
MODEL ?= moonshotai/kimi-k2.5
CONCURRENCY ?= 2000
MAX_COST ?= 95
TOKEN_BUDGET ?= 10M
MAX_TOKENS ?= 16384
IGNORE_PROVIDERS ?= fireworks baseten
QUANTIZATIONS ?= int4 unknown
MIN_CREDITS ?= 5
TOKENIZER ?= ./kimi-k2.5
BASE_URL ?= https://openrouter.ai/api/v1
PROMPT_FLAGS ?=
INFER_FLAGS ?=
TOKENIZE_FLAGS ?= --trust-remote-code
SHARD_FLAGS ?=

INFER_ARGS = --model $(MODEL) --concurrency $(CONCURRENCY) --max-tokens $(MAX_TOKENS) \
  $(if $(MAX_COST),--max-cost $(MAX_COST)) $(if $(TOKEN_BUDGET),--token-budget $(TOKEN_BUDGET)) \
  $(if $(MIN_CREDITS),--min-credits $(MIN_CREDITS)) \
  $(foreach p,$(IGNORE_PROVIDERS),--ignore-provider $(p)) \
  $(foreach q,$(QUANTIZATIONS),--quantization $(q)) --base-url $(BASE_URL) $(INFER_FLAGS)

.PHONY: all test lint venv demo credits clean-venv FORCE
.SECONDARY:

all: $(foreach d,$(DATASETS),$(SHARDS)/$(d)/manifest.json)
	@echo "make all: shards for $(DATASETS) are in $(SHARDS)/"

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@# Byte-compile the checkout, as pip does for an installed package: an editable
	@# install is not compiled, and with PYTHONDONTWRITEBYTECODE set (common in
	@# containers) every command would compile kimipipe again on each start (~15 ms).
	@# Not the bundled tokenizers: their code is data, copied as it is.
	$(BIN)/python -m compileall -q -x 'kimipipe/data/' kimipipe
	touch $@

test: venv
	$(BIN)/python -m pytest -q -n $(PYTEST_JOBS) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check kimipipe tests bench

# The offline demo: the stand-in on a free port, the bundled prompts and tokenizer, and
# this very Makefile's `all` target against them (see kimipipe/demo.py).
DEMO_OUT ?= demo-out
demo: venv
	$(BIN)/python -m kimipipe.demo --out $(DEMO_OUT) --make "$(MAKE)" --venv $(VENV)

credits: venv
	$(BIN)/kp-credits --base-url $(BASE_URL)

clean-venv:
	rm -rf $(VENV)

# --- the stages, per dataset --------------------------------------------------------------
$(WORK) $(SHARDS):
	mkdir -p $@

# Stage 1: prompts (kp-prompts writes the file whole or not at all).
$(WORK)/%.prompts.jsonl: | venv $(WORK)
	$(BIN)/kp-prompts $(call source,$*) --dataset $* $(PROMPT_FLAGS) -o $@

# The flags a stage ran with: rewritten only when they change, so raising TOKEN_BUDGET or
# MAX_COST makes the responses stage run again (and resume), nothing else.
$(WORK)/%.infer-flags: FORCE | $(WORK)
	@echo '$(INFER_ARGS)' | cmp -s - $@ || echo '$(INFER_ARGS)' > $@

# Stage 2: responses. Exit 0 (all done, or TOKEN_BUDGET reached: the dataset is as large
# as asked) and 4 (done, some failed: see WORK/<D>.failures.jsonl) finish the stage; exit 3
# is money (MAX_COST, a 402, MIN_CREDITS): the build stops, resumable.
$(WORK)/%.responses.done: $(WORK)/%.prompts.jsonl $(WORK)/%.infer-flags | venv
	@set +e; $(BIN)/kp-infer $< -o $(WORK)/$*.responses.jsonl --failures $(WORK)/$*.failures.jsonl \
	  --summary-json $(WORK)/$*.infer-summary.json $(INFER_ARGS); code=$$?; \
	if [ $$code -eq 0 ] || [ $$code -eq 4 ]; then touch $@; \
	elif [ $$code -eq 3 ]; then \
	  echo "make: $* stopped by MAX_COST, the balance or MIN_CREDITS (exit 3): raise the budget or add credits, then rerun make to resume" >&2; exit 3; \
	elif [ $$code -eq 130 ]; then echo "make: interrupted; rerun make to resume" >&2; exit 130; \
	else exit $$code; fi

# Stage 3: tokens (kp-tokenize resumes from a partial file; the stamp marks it finished).
# Exit 4: finished, some records failed verification (WORK/<D>.rejects.jsonl); kept out.
$(WORK)/%.tokens.done: $(WORK)/%.responses.done | venv
	@set +e; $(BIN)/kp-tokenize $(WORK)/$*.responses.jsonl --tokenizer $(TOKENIZER) $(TOKENIZE_FLAGS) \
	  -o $(WORK)/$*.tokens.jsonl.zst --rejects $(WORK)/$*.rejects.jsonl; code=$$?; \
	if [ $$code -eq 0 ] || [ $$code -eq 4 ]; then touch $@; else exit $$code; fi

# Stage 4: shards (kp-shard writes the set and its manifest atomically).
$(SHARDS)/%/manifest.json: $(WORK)/%.tokens.done | venv $(SHARDS)
	$(BIN)/kp-shard $(WORK)/$*.tokens.jsonl.zst --out $(SHARDS)/$* --name $* $(SHARD_FLAGS)
	$(BIN)/kp-shard verify $(SHARDS)/$*

# One stage of one dataset, run again from the saved files: make B3.tokens
%.prompts: FORCE
	rm -f $(WORK)/$*.prompts.jsonl && $(MAKE) $(WORK)/$*.prompts.jsonl
%.responses: FORCE
	rm -f $(WORK)/$*.responses.done && $(MAKE) $(WORK)/$*.responses.done
%.tokens: FORCE
	rm -f $(WORK)/$*.tokens.done $(WORK)/$*.tokens.jsonl.zst && $(MAKE) $(WORK)/$*.tokens.done
%.shards: FORCE
	rm -f $(SHARDS)/$*/manifest.json && $(MAKE) $(SHARDS)/$*/manifest.json

FORCE:
