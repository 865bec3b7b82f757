"""transformers' table of its models' names, read once per installation, not once per start.

`import transformers` (any part of it) first builds a table of the name every one of its
~500 model packages exports, by reading ~1,700 source files
(`transformers.utils.import_utils.define_import_structure` on `transformers/models`): ~0.27
CPU-s of the ~0.85 that a kp-tokenize start costs, and the same answer every time for one
installation. `use_saved_import_table()`, called before transformers is imported, keeps
that table in a file and gives it to transformers instead of a new read.

The file: `$XDG_CACHE_HOME/kimipipe/transformers-imports/` (else `~/.cache/...`), one per
transformers installation (named by the digest of its path), holding the table and the
installation's signature: the path, size and mtime of `import_utils.py` (the code that
reads the files) and the mtime of `models/` and of each package directory in it, which
adding, removing or renaming any file changes, as every pip install, upgrade and uninstall
does. A file whose signature differs is read anew and replaced (written beside it and
renamed over it, so a reader never sees half a file).

What it cannot change: token IDs. The table only says which module holds which name, for
transformers' lazy `transformers.X` / `transformers.models.X` lookups; a table that named a
module wrongly would fail that import, loudly. Anything unexpected (no writable cache
directory, an unreadable or foreign file, a transformers whose function is not there or
takes other arguments) falls back to transformers' own read, silently: the table is an
optimisation, never a reason to fail. KP_NO_IMPORT_CACHE=1 turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import os
import pickle
import sys
import tempfile
from pathlib import Path

_MODULE = "transformers.utils.import_utils"
_FORMAT = 1


def cache_dir() -> Path | None:
    """Where the tables are kept; None when there is no home to keep them in."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.path.expanduser("~")
        base = os.path.join(home, ".cache") if home != "~" else ""
    return Path(base) / "kimipipe" / "transformers-imports" if base else None


def use_saved_import_table() -> None:
    """Before transformers is imported: serve its models' import table from the saved file.
    Does nothing once transformers is imported, or when KP_NO_IMPORT_CACHE is set."""
    if os.environ.get("KP_NO_IMPORT_CACHE") or _MODULE in sys.modules:
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds import_utils as Python would, and wraps its define_import_structure once the
    module has run (transformers' __init__ takes the name from it right after)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = _Loader(spec.loader.name, spec.loader.path)
        return spec


class _Loader(importlib.machinery.SourceFileLoader):
    def exec_module(self, module) -> None:
        super().exec_module(module)
        original = getattr(module, "define_import_structure", None)
        if callable(original):
            module.define_import_structure = _saved(original, Path(module.__file__))


def _arguments(module_path, prefix=None):
    return module_path, prefix


def _saved(original, import_utils: Path):
    models = (import_utils.parent.parent / "models").resolve()
    served: dict = {}  # as transformers' own lru_cache: one table object per call's key

    @functools.wraps(original)
    def define_import_structure(*args, **kwargs):
        try:
            module_path, prefix = _arguments(*args, **kwargs)
            path = Path(module_path)
        except TypeError:  # called otherwise than this module knows: transformers' own
            return original(*args, **kwargs)
        directory = path if path.is_dir() else path.parent
        if directory.resolve() != models or not isinstance(prefix, (str, type(None))):
            return original(*args, **kwargs)
        if prefix not in served:
            served[prefix] = _table(original, module_path, prefix, models, import_utils)
        return served[prefix]

    return define_import_structure


def signature(models: Path, import_utils: Path) -> tuple:
    """What changes when the installation's files do (the module's text says which)."""
    stat = import_utils.stat()
    entries = []
    with os.scandir(models) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                entries.append((entry.name, entry.stat(follow_symlinks=False).st_mtime_ns))
    return (_FORMAT, str(models), str(import_utils), stat.st_size, stat.st_mtime_ns,
            models.stat().st_mtime_ns, tuple(sorted(entries)))


def _table(original, module_path, prefix, models: Path, import_utils: Path):
    directory = cache_dir()
    try:
        mark = signature(models, import_utils)
    except OSError:
        return original(module_path, prefix)
    file = None
    if directory is not None:
        file = directory / (hashlib.sha256(str(models).encode()).hexdigest()[:24]
                            + f"-{prefix or ''}.pickle")
        try:
            with open(file, "rb") as f:
                saved_mark, table = pickle.load(f)
            if saved_mark == mark and isinstance(table, dict):
                return table
        except Exception:  # absent, unreadable, foreign, of another format: read anew
            pass
    table = original(module_path, prefix)
    if file is not None:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".tmp-", suffix=".pickle")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump((mark, table), f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, file)
            except BaseException:
                os.unlink(tmp)
                raise
        except Exception:  # a read-only home, a full disk: transformers' own read it is
            pass
    return table
