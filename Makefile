# kimipipe: set-up, tests, and (as their issues land) the dataset builds.
#   make test     set up .venv if missing, then run the test suite
#   make lint     ruff
# Every target that needs the package sets up the virtual environment itself.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: all test lint venv demo clean-venv

all:
	@echo "make all: the dataset builds arrive with their issue (full builds with make)"; exit 2

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

test: venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check kimipipe tests bench

# The offline demo: grows into the full pipeline as the stage issues land.
DEMO_OUT ?= demo-out
demo: venv
	mkdir -p $(DEMO_OUT)
	$(BIN)/kp-prompts kimipipe/data/demo/sharegpt.json --dataset demo -o $(DEMO_OUT)/demo.prompts.jsonl
	@echo "demo: prompts in $(DEMO_OUT)/demo.prompts.jsonl (inference, tokenization and shards arrive with their issues)"

clean-venv:
	rm -rf $(VENV)
