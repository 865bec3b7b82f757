#!/usr/bin/env bash
# The real trainers' virtual environments for `make test-trainers`, built once and kept
# OUTSIDE the checkout (KP_TRAINERS_CACHE, default ~/.cache/kimipipe/trainers): each takes
# ~5-10 minutes and ~1.5-2.5 GB on two cores, so it is rebuilt only when it is missing,
# was left half-built or was made by another recipe (the `.complete` stamp, written last,
# holds the recipe).
#
#   tests/trainers/install.sh specforge|speculators   -> prints the venv's path on stdout
#
# Both go over the CPU build of torch 2.13.0 (pip takes it from this machine's wheel
# folder; a bare `torch` requirement would fetch a multi-GB CUDA build):
# - specforge 0.2.0 pins the GPU serving stack (torch 2.11, sglang 0.5.14): installed
#   --no-deps, then its pure-Python requirements, triton (specforge/core/loss.py imports
#   it) and tiktoken (Kimi's tokenizer).
# - speculators 0.9.0 pulls CUDA torchvision/torchaudio, which fail to import beside CPU
#   torch; speculators imports neither, so they are removed after. zstandard: the
#   `datasets` it runs reads a zstd JSONL set (`--data hf:DIR`) through it (fsspec).
set -euo pipefail
which=${1:?usage: install.sh specforge|speculators}
cache=${KP_TRAINERS_CACHE:-$HOME/.cache/kimipipe/trainers}
venv=$cache/$which
python=${PYTHON:-python3}
# What each environment is made of: a change to its line rebuilds it (the stamp holds it).
case $which in
  specforge) recipe="torch==2.13.0; --no-deps specforge==0.2.0; transformers==5.8.1 datasets accelerate huggingface-hub numpy openai-harmony pydantic psutil pyyaml safetensors requests tqdm typing-extensions triton tiktoken" ;;
  # zstandard: datasets reads a zstd JSONL set (`prepare-data --data hf:DIR`) through it
  speculators) recipe="torch==2.13.0 torchvision==0.28.0 speculators==0.9.0 tiktoken zstandard; -torchvision -torchaudio -torchcodec" ;;
  *) echo "install.sh: no trainer called $which" >&2; exit 2 ;;
esac
if [ -f "$venv/.complete" ] && [ "$(cat "$venv/.complete")" = "$recipe" ]; then echo "$venv"; exit 0; fi
rm -rf "$venv"
mkdir -p "$cache"
log=$cache/$which.install.log
echo "install.sh: building $venv (log: $log)" >&2
{
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check --no-input)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" torch==2.13.0
  case $which in
    specforge)
      "${pip[@]}" --no-deps specforge==0.2.0
      "${pip[@]}" torch==2.13.0 transformers==5.8.1 datasets accelerate huggingface-hub numpy \
        openai-harmony pydantic psutil pyyaml safetensors requests tqdm typing-extensions \
        triton tiktoken
      ;;
    speculators)
      "${pip[@]}" torch==2.13.0 torchvision==0.28.0 speculators==0.9.0 tiktoken zstandard
      "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
      ;;
  esac
  "$venv/bin/python" -m pip list --format=freeze > "$venv/versions.txt"
} >"$log" 2>&1 || { echo "install.sh: $which failed; the end of $log:" >&2; tail -20 "$log" >&2; exit 1; }
echo "$recipe" > "$venv/.complete"
echo "$venv"
