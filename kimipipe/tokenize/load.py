"""Loading a tokenizer offline, from a local directory or the local Hugging Face cache.

Nothing is ever fetched: `HF_HUB_OFFLINE=1` is set before transformers is imported and every
call passes `local_files_only=True`. `--tokenizer` is either a directory (as downloaded from
the model's page) or a model name already in the local cache, which is resolved to its
snapshot directory here.

Tokenizers that ship their own code (Kimi K2.5: `tokenization_kimi.py`, importing tiktoken
and a sibling module by a relative import) need `trust_remote_code`; without it, or when a
package their code imports is missing, the error is one line saying what to do.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import ExitCode, KPError

_HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")


def offline_environment(debug: bool = False) -> None:
    """Make huggingface_hub/transformers offline and quiet; call before importing them."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if not debug:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


class TokenizerLoadError(KPError):
    exit_code = ExitCode.USAGE


def resolve_tokenizer_dir(spec: str) -> Path:
    """The local directory holding SPEC's tokenizer files (a path, or a cached model name)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise TokenizerLoadError(f"--tokenizer {spec}: not a directory")
    if _HUB_NAME.fullmatch(spec) and not spec.startswith("."):
        offline_environment()
        try:
            from huggingface_hub import snapshot_download
            return Path(snapshot_download(spec, local_files_only=True))
        except Exception:
            pass
    raise TokenizerLoadError(
        f"--tokenizer {spec}: no such directory, and no model of that name in the local Hugging "
        "Face cache (nothing is downloaded; docs/kp-tokenize.md, 'Getting the tokenizer (offline)')")


def prepare_tokenizer_dir(spec: str, trust_remote_code: bool) -> Path:
    """Resolve SPEC and check what can be checked before transformers runs anything."""
    directory = resolve_tokenizer_dir(spec)
    config_path = directory / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TokenizerLoadError(f"{config_path}: unreadable: {e}") from None
    auto_map = config.get("auto_map") or {}
    custom = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    if custom and not trust_remote_code:
        names = [c for c in (custom if isinstance(custom, list) else [custom]) if c]
        module = names[0].split(".")[0] + ".py" if names else "its own code"
        raise TokenizerLoadError(
            f"{directory} ships its own tokenizer code ({module}); rerun with "
            "--trust-remote-code to run it")
    if not config and not (directory / "tokenizer.json").is_file():
        raise TokenizerLoadError(
            f"{directory}: no tokenizer_config.json or tokenizer.json: not a tokenizer directory")
    return directory


def _has_custom_model_config(directory: Path) -> bool:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("auto_map"))


_MISSING_PACKAGES = re.compile(r"not found in your environment: ([^.]+)\.")


def _named_class(directory: Path, trust_remote_code: bool):
    """The tokenizer class DIRECTORY names for itself, where AutoTokenizer's choice is plain:
    the code it ships (tokenizer_config.json's auto_map, run under trust_remote_code; Kimi
    K2.5's) or the generic tokenizers backend (`PreTrainedTokenizerFast`) with no model
    config beside it. Else None: AutoTokenizer decides, with its per-model rules.

    Why not always AutoTokenizer: its import builds transformers' table of every model it
    knows, reading ~3,300 source files, 0.25 CPU-s of each kp-tokenize start (~20%). The
    class taken here is the one AutoTokenizer takes in these cases, by the same calls
    (tests/test_tokenize_parts.py compares the two on each bundled kind and the real one)."""
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    auto_map = config.get("auto_map")
    ref = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else auto_map
    if ref:
        # AutoTokenizer's pick from auto_map: the fast class, else the slow one
        class_ref = (ref[1] or ref[0]) if isinstance(ref, (list, tuple)) and len(ref) == 2 else None
        if not (trust_remote_code and class_ref and "--" not in class_ref):
            return None
        if (directory / "config.json").exists() and not _has_custom_model_config(directory):
            return None  # a known model type: AutoTokenizer may prefer its own class
        named = config.get("tokenizer_class")
        if named and named.removesuffix("Fast") != class_ref.rsplit(".", 1)[-1]:
            return None  # a class of transformers' named too: its aliases are AutoTokenizer's
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        # AutoTokenizer also calls cls.register_for_auto_class(), which only tells
        # save_pretrained what to write in auto_map (and imports the model table): never
        # needed to tokenize.
        return get_class_from_dynamic_module(class_ref, str(directory), local_files_only=True)
    if (config.get("tokenizer_class") in ("PreTrainedTokenizerFast", "TokenizersBackend")
            and (directory / "tokenizer.json").is_file()
            and not (directory / "config.json").exists()):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend
    return None


def load_tokenizer(directory: Path, *, trust_remote_code: bool = False,
                   chat_template: str | None = None, debug: bool = False, auto: bool = False):
    """The transformers tokenizer in DIRECTORY (offline), with CHAT_TEMPLATE if given.
    AUTO: always through AutoTokenizer (the tests' reference for the class taken here)."""
    offline_environment(debug)
    try:
        named = None if auto else _named_class(directory, trust_remote_code)
        if named is not None:
            kwargs = {"trust_remote_code": True} if named.__module__.startswith(
                "transformers_modules") else {}
            tok = named.from_pretrained(str(directory), local_files_only=True, **kwargs)
        else:
            from transformers import AutoTokenizer

            extra: dict[str, Any] = {}
            if _has_custom_model_config(directory):
                # AutoTokenizer loads the model's config first, running its code (which may
                # need torch); a tokenizer never needs it, so hand it an empty one.
                from transformers import PretrainedConfig
                extra["config"] = PretrainedConfig()
            tok = AutoTokenizer.from_pretrained(
                str(directory), trust_remote_code=trust_remote_code, local_files_only=True,
                **extra)
    except ImportError as e:
        # A module that is not there at all (transformers checks the code's imports first and
        # says so in its message) is a missing package; "cannot import name X from Y" is code
        # written for another version of Y.
        m = _MISSING_PACKAGES.search(str(e))
        missing = m.group(1).strip() if m else (
            e.name if isinstance(e, ModuleNotFoundError) else None)
        if missing:
            top = missing.split(",")[0].split(".")[0].strip()
            raise TokenizerLoadError(
                f"the tokenizer code in {directory} needs the Python package `{top}`, which is "
                f"not installed (pip install {top})") from None
        raise TokenizerLoadError(
            f"the tokenizer code in {directory} does not import with the installed packages: {e}"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TokenizerLoadError(
            f"cannot load the tokenizer in {directory}: {type(e).__name__}: {e}") from None
    if chat_template is not None:
        tok.chat_template = chat_template
    if not getattr(tok, "chat_template", None):
        # (Kimi K2.5's tokenizer_config.json has none: the model's template is a file of
        # its own in the model's repository, which transformers reads from the directory)
        raise TokenizerLoadError(
            f"the tokenizer in {directory} has no chat template: the model's is its "
            "repository's chat_template.jinja (Kimi K2.5: `hf download moonshotai/Kimi-K2.5 "
            f"chat_template.jinja --local-dir {directory}`, docs/kp-tokenize.md); "
            "download it there, or pass --chat-template FILE")
    return tok
