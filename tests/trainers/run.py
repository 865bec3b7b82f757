"""`make test-trainers`: the real trainers' own code on kimipipe's output.

Not part of `make test` or .ci/run: it installs SpecForge 0.2.0 and speculators 0.9.0
(~15 minutes and ~4 GB the first time, on two cores) into virtual environments kept
outside the checkout (tests/trainers/install.sh; KP_TRAINERS_CACHE, default
~/.cache/kimipipe/trainers), rebuilt only when missing. No file here is named test_*.py,
so the main suite never collects it.

What it runs, in a temporary directory (KP_TRAINERS_KEEP=1 keeps it and prints where):
1. the data: `make demo` (the whole pipeline against the stand-in), its answers
   re-tokenized with Kimi K2.5's real tokenizer (../shared/kimi-k2.5-tokenizer, or
   KP_KIMI_TOKENIZER, with the project's K2.5 chat template beside it), sharded with an
   eval split, verified, and exported with `kp-shard export` for each trainer;
   the target model both trainers are pointed at is that tokenizer with a small Llama
   config.json of its vocabulary (no weights: nothing here loads them);
2. specforge_checks.py in SpecForge's environment, speculators_checks.py in speculators'
   (see each for its checks), each given the paths as JSON; each prints one `ok NAME` or
   `FAIL NAME: why` line per check.

It ends with `N passed, M failed` and exits 1 when any check failed or could not run.

    make test-trainers            # or: .venv/bin/python tests/trainers/run.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BIN = Path(sys.executable).parent  # the kimipipe venv's, whose python runs this
REAL_TOKENIZER = Path(os.environ.get("KP_KIMI_TOKENIZER")
                      or REPO.parent / "shared" / "kimi-k2.5-tokenizer")
TEMPLATE = REPO / "kimipipe" / "data" / "tokenizers" / "kimi-k2.5-mini-tiktoken" / "chat_template.jinja"
TRAINERS = ("specforge", "speculators")


def say(text: str) -> None:
    print(text, flush=True)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    """CMD, its output kept; a failure shows the command and the end of what it printed."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n"
                           f"{(p.stdout + p.stderr)[-3000:]}")
    return p


def install(trainer: str) -> Path:
    started = time.monotonic()
    venv = Path(run(["bash", HERE / "install.sh", trainer]).stdout.strip().splitlines()[-1])
    versions = (venv / "versions.txt").read_text().split()
    pins = [v for v in versions if v.split("==")[0].lower() in (trainer, "torch", "transformers")]
    say(f"{trainer}: {venv} ({', '.join(pins)}; {time.monotonic() - started:.0f} s)")
    return venv


def make_data(tmp: Path) -> dict:
    """The shards of `make demo`, re-tokenized with the real tokenizer, and the target."""
    if not (REAL_TOKENIZER / "tiktoken.model").is_file():
        raise RuntimeError(f"Kimi K2.5's real tokenizer files are not in {REAL_TOKENIZER} "
                           "(set KP_KIMI_TOKENIZER)")
    demo = tmp / "demo"
    run(["make", "-C", REPO, "demo", f"DEMO_OUT={demo}", f"VENV={BIN.parent}"])
    target = tmp / "target"  # the real tokenizer files, the K2.5 template, a Llama config
    target.mkdir()
    for f in REAL_TOKENIZER.iterdir():
        if f.is_file() and f.name != "config.json":  # (the real model's: not this one's)
            (target / f.name).symlink_to(f.resolve())
    shutil.copyfile(TEMPLATE, target / "chat_template.jinja")
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "vocab_size": 163840, "max_position_embeddings": 8192,
        "bos_token_id": 163584, "eos_token_id": 163586, "torch_dtype": "float32"}))
    tokens = tmp / "demo.tokens.jsonl.zst"
    run([BIN / "kp-tokenize", demo / "work" / "demo.responses.jsonl", "--tokenizer", target,
         "--trust-remote-code", "-o", tokens, "--rejects", tmp / "demo.rejects.jsonl", "-q"])
    shards = tmp / "shards" / "demo"
    run([BIN / "kp-shard", tokens, "--out", shards, "--name", "demo", "--eval-fraction", "0.1",
         "-q"])
    run([BIN / "kp-shard", "verify", shards])
    manifest = json.loads((shards / "kp-shard.manifest").read_text())
    paths = {"shards": str(shards), "target": str(target), "manifest": manifest,
             "docs": str(REPO / "docs" / "training.md"), "tmp": str(tmp)}
    for trainer in TRAINERS:
        out = tmp / f"export-{trainer}"
        run([BIN / "kp-shard", "export", shards, "--for", trainer, "--out", out, "--target",
             target, "-q"])
        paths[f"export_{trainer}"] = str(out)
    splits = {k: v["records"] for k, v in manifest["splits"].items()}
    say(f"data: make demo's answers re-tokenized with {REAL_TOKENIZER}: {splits} rows in "
        f"{shards}")
    return paths


def main() -> int:
    passed, failed = 0, []
    keep = os.environ.get("KP_TRAINERS_KEEP") == "1"
    tmp = Path(tempfile.mkdtemp(prefix="kp-trainers-"))
    try:
        venvs = {t: install(t) for t in TRAINERS}
        paths = make_data(tmp)
        (tmp / "paths.json").write_text(json.dumps(paths))
        for trainer in TRAINERS:
            started = time.monotonic()
            python = venvs[trainer] / "bin" / "python"
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp / "hf"),
                   "PATH": f"{venvs[trainer] / 'bin'}:{os.environ['PATH']}",
                   "PYTHONPATH": ""}
            p = subprocess.run([python, HERE / f"{trainer}_checks.py", tmp / "paths.json"],
                               capture_output=True, text=True, env=env, cwd=tmp)
            lines = [x for x in p.stdout.splitlines() if x.startswith(("ok ", "FAIL "))]
            for line in lines:
                say(f"{trainer}: {line}")
                if line.startswith("ok "):
                    passed += 1
                else:
                    failed.append(f"{trainer}: {line}")
            if p.returncode != 0 and not any(x.startswith("FAIL ") for x in lines):
                failed.append(f"{trainer}: its checks exited {p.returncode}")
                say(f"{trainer}: FAIL its checks exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
            say(f"{trainer}: checks took {time.monotonic() - started:.0f} s")
    except (RuntimeError, OSError) as e:
        failed.append(str(e).splitlines()[0])
        say(f"FAIL {e}")
    finally:
        if keep:
            say(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
