"""`make check` (and `make all` before its first paid stage): what would fail later, now.

Each check runs whatever the others find, and every problem is listed:

- sources: each dataset's source file exists (or its prompts file is already built);
- tokenizer: `kp-tokenize --check` loads TOKENIZER with TOKENIZE_FLAGS as the tokens
  stage will (else a missing tokenizer is found after all inference is paid). A
  directory that loaded before, unchanged since (the same files, sizes and times, the same
  flags, the same transformers and kimipipe), is not loaded again: `make all` reruns the
  checks after every money change, and a load costs seconds (WORK/.tokenizer-check.json);
- key and base URL: `kp-credits` reads the balance: one GET to BASE_URL, where a wrong key
  fails once instead of on a full concurrency of requests, and a URL that cannot be
  reached is named; with MIN_CREDITS set and a key that can read no balance (a normal key
  without a credit limit), the line warns that MIN_CREDITS guards nothing, and why;
- outputs: WORK and SHARDS can be created and written, and no output file the build
  writes there is read-only.

`python -m kimipipe.make.check --fingerprint TOKENIZER` prints the digest of the
tokenizer's files (`stamp_fingerprint`) that the Makefile's tokens stage depends on.

The report goes to stdout, one line per check; the exit code is 2 when anything failed
(nothing was started), else 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import tempfile
from importlib.metadata import PackageNotFoundError, version

OUTPUT_SUFFIXES = (".responses.jsonl", ".failures.jsonl", ".infer-summary.json", ".tokens.jsonl.zst",
                   ".rejects.jsonl", ".pilot.json", ".plan.json")


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "(no message)"


def _run(command: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 1, "", f"no answer within {timeout:g} s"
    except OSError as e:
        return 1, "", str(e)
    return proc.returncode, proc.stdout, proc.stderr


def check_sources(sources: dict[str, tuple[str, str]]) -> list[tuple[bool, str]]:
    results = []
    for name, (source, prompts) in sources.items():
        if os.path.isfile(source):
            results.append((True, f"{name}: source {source}"))
        elif os.path.isfile(prompts):
            results.append((True, f"{name}: prompts {prompts} (built already; source {source} not needed)"))
        else:
            results.append((False, f"{name}: no source file {source} (put it there, or set SOURCE_{name}=PATH)"))
    return results


def tokenizer_files(tokenizer: str) -> list[list]:
    """[relative path, size, mtime in ns] of every file of a tokenizer directory: what
    tells a changed tokenizer from the same one, at the cost of a stat per file (a hash
    would read a whole model checkout when TOKENIZER is one)."""
    files = []
    for root, dirs, names in os.walk(tokenizer):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            st = os.stat(os.path.join(root, name))
            files.append([os.path.relpath(os.path.join(root, name), tokenizer), st.st_size,
                          st.st_mtime_ns])
    return files


def stamp_fingerprint(tokenizer: str) -> str:
    """One word for the tokens stage's stamp (the Makefile's WORK/D.tokenize-flags): a
    digest of `tokenizer_files`, or `name` for a model name that is not a directory (the
    Hugging Face cache resolves it: only its name is known here)."""
    if not os.path.isdir(tokenizer):
        return "name"
    listing = json.dumps(tokenizer_files(tokenizer)).encode()
    return "files-" + hashlib.sha256(listing).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: str, flags: str) -> dict | None:
    """What a tokenizer check's result depends on, for a directory TOKENIZER; None for a
    model name (resolved in the Hugging Face cache: always loaded)."""
    if not os.path.isdir(tokenizer):
        return None
    files = tokenizer_files(tokenizer)
    versions = {}
    for package in ("transformers", "tokenizers", "tiktoken", "kimipipe"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return {"tokenizer": os.path.abspath(tokenizer), "flags": flags, "files": files,
            "versions": versions}


def check_tokenizer_runs(bin_dir: str, tokenizer: str, flags: str,
                    memo: str | None = None) -> tuple[bool, str]:
    fingerprint = tokenizer_fingerprint(tokenizer, flags) if memo else None
    if fingerprint is not None:
        try:
            with open(memo, encoding="utf-8") as f:
                before = json.load(f)
            if before.get("fingerprint") == fingerprint:
                return True, f"tokenizer: {before['line']} (unchanged since it loaded: not reloaded)"
        except (OSError, ValueError, AttributeError, KeyError):
            pass
    code, out, err = _run([os.path.join(bin_dir, "kp-tokenize"), "--check", "--tokenizer", tokenizer,
                           *shlex.split(flags)], timeout=600)
    if code == 0:
        line = _last_line(out).removeprefix("kp-tokenize: ")
        if fingerprint is not None:
            try:
                os.makedirs(os.path.dirname(memo) or ".", exist_ok=True)
                with open(memo, "w", encoding="utf-8") as f:
                    json.dump({"fingerprint": fingerprint, "line": line}, f)
            except OSError:
                pass  # WORK not writable: the outputs check says so
        return True, f"tokenizer: {line}"
    if memo:
        try:
            os.unlink(memo)
        except OSError:
            pass
    return False, f"tokenizer: {_last_line(err)} (TOKENIZER={tokenizer})"


def check_key(bin_dir: str, base_url: str, min_credits: str = "") -> tuple[bool, str]:
    code, out, err = _run([os.path.join(bin_dir, "kp-credits"), "--json", "--base-url", base_url],
                          timeout=60)
    if code == 0:
        balance = json.loads(out)
        spendable = [v for v in (balance.get("remaining"), balance.get("key_limit_remaining")) if v is not None]
        left = f"${min(spendable):,.4f} can be spent" if spendable else "the balance is unknown"
        line = f"key and base URL: {base_url} answers ({left})"
        # kp-credits says why no balance can be shown (a normal key without a credit limit)
        why = next((x.split("no balance to show: ", 1)[1] for x in err.splitlines()
                    if "no balance to show: " in x), None)
        if not spendable and min_credits and why:
            line += f"; warning: MIN_CREDITS={min_credits} guards nothing: {why}"
        return True, line
    return False, f"key and base URL: {_last_line(err)} (BASE_URL={base_url})"


def check_output_dirs(directories: list[str], work: str, datasets: list[str]) -> list[tuple[bool, str]]:
    results = []
    for directory in directories:
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".kp-check-"):
                pass
            results.append((True, f"outputs: {directory}/ is writable"))
        except OSError as e:
            results.append((False, f"outputs: {directory}/ cannot be written ({e.strerror or e})"))
    for name in datasets:
        for suffix in OUTPUT_SUFFIXES:
            path = os.path.join(work, name + suffix)
            if os.path.exists(path) and not os.access(path, os.W_OK):
                results.append((False, f"outputs: {path} is read-only"))
    return results


def run_checks(sources: dict[str, tuple[str, str]], bin_dir: str, tokenizer: str, tokenize_flags: str,
               base_url: str, directories: list[str], work: str,
               min_credits: str = "") -> list[tuple[bool, str]]:
    results = check_sources(sources)
    results.append(check_tokenizer_runs(bin_dir, tokenizer, tokenize_flags,
                                   os.path.join(work, ".tokenizer-check.json")))
    results.append(check_key(bin_dir, base_url, min_credits))
    results += check_output_dirs(directories, work, list(sources))
    return results


if __name__ == "__main__":  # `python -m kimipipe.make.check --fingerprint DIR` (the Makefile)
    import sys

    if sys.argv[1:2] != ["--fingerprint"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m kimipipe.make.check --fingerprint TOKENIZER")
    print(stamp_fingerprint(sys.argv[2]))
