"""`make clean` and `make D.clean`: a build's files removed, after saying which.

Per dataset D: every WORK/D.* file (prompts, responses, failures, tokens, rejects, plans,
summaries, stamps, lock files) and SHARDS/D/; with the build's own (`make clean`):
WORK/build.*, WORK/total-cost.json and the tokenizer check's memo, then WORK and SHARDS
themselves when nothing else is left in them.

Answers paid for are not removed by mistake: when a responses or failures file holds a
cost that the stand-in did not bill (a generation id without its mark, kimipipe/recorded/api.py),
nothing is removed (exit 2) and the message names the file, its answers and their cost;
`CLEAN_PAID=1` (`--paid`) removes them too. A file a kp-infer is writing (its lock held)
is never removed (exit 2). Every path is listed before anything goes.
"""

from __future__ import annotations

import glob
import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass

import msgspec

from ..errors import ExitCode, KPError
from ..io import iter_lines
from ..locks import OutputLock, lock_path
from ..recorded.api import is_standin
from ..terminal import counted

BUILD_FILES = ("build.flags", "build.gate", "build.plan.json", "total-cost.json", ".tokenizer-check.json")


class _Paid(msgspec.Struct):
    id: str = ""
    usage: dict | None = None
    cost: float = 0.0
    generation_id: str | None = None
    api: str | None = None


_decoder = msgspec.json.Decoder(_Paid)


@dataclass
class PaidFile:
    path: str
    records: int = 0
    cost: float = 0.0  # USD not billed by the stand-in
    apis: tuple[str, ...] = ()


def paid_in(path: str) -> PaidFile:
    """The records of PATH whose cost was not the stand-in's, and what they cost."""
    found = PaidFile(path)
    apis = set()
    for _lineno, line, _ended in iter_lines(path):
        try:
            rec = _decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # a torn line: nothing anyone can resume from
        cost = float((rec.usage or {}).get("cost") or 0.0) + rec.cost
        if cost > 0 and not is_standin(rec.generation_id):
            found.records += 1
            found.cost += cost
            apis.add(rec.api or "an API not recorded")
    found.apis = tuple(sorted(apis))
    return found


def files_of(work: str, shards: str, datasets: list[str], build: bool) -> tuple[list[str], list[str]]:
    """(files, directories) a clean removes, those that exist."""
    files: list[str] = []
    directories: list[str] = []
    for name in datasets:
        files += sorted(glob.glob(os.path.join(glob.escape(work), f"{glob.escape(name)}.*")))
        files += sorted(glob.glob(os.path.join(glob.escape(work), f".{glob.escape(name)}.*")))
        shard_dir = os.path.join(shards, name)
        if os.path.isdir(shard_dir):
            directories.append(shard_dir)
    if build:
        files += [p for p in (os.path.join(work, n) for n in BUILD_FILES) if os.path.exists(p)]
    return [p for p in files if os.path.isfile(p) or os.path.islink(p)], directories


def clean(work: str, shards: str, datasets: list[str], build: bool, paid: bool,
          say=print) -> int:
    what = " ".join(datasets) + (" and the build's own files" if build else "")
    files, directories = files_of(work, shards, datasets, build)
    if not files and not directories:
        say(f"make clean: nothing to remove for {what} (in {work}/ and {shards}/)")
        return ExitCode.OK
    answers = [p for p in files if p.endswith((".responses.jsonl", ".failures.jsonl"))]
    kept = [found for found in map(paid_in, answers) if found.records] if not paid else []
    if kept:
        lines = [f"  {k.path}: {counted(k.records, 'paid record')}, ${k.cost:,.4f} ({', '.join(k.apis)})"
                 for k in kept]
        raise KPError("nothing removed: these hold answers paid for (not the stand-in's):\n"
                      + "\n".join(lines) + "\nCLEAN_PAID=1 removes them too", ExitCode.USAGE)
    say(f"make clean: removing {what}:")
    for path in files:
        say(f"  {path}")
    for path in directories:
        count = sum(len(names) for _root, _dirs, names in os.walk(path))
        say(f"  {path}/ ({counted(count, 'file')})")
    with ExitStack() as stack:  # a kp-infer writing one of them refuses the whole clean
        for path in answers:
            if not os.path.basename(path).startswith("."):
                stack.enter_context(OutputLock(path, "make clean"))
        locks = {lock_path(p) for p in answers}
        for path in files:
            if path not in locks:
                os.unlink(path)
    for path in directories:
        shutil.rmtree(path)
    if build:
        for directory in (shards, work):
            try:
                os.rmdir(directory)  # only when nothing else is left in it
            except OSError:
                pass
    say(f"make clean: removed {counted(len(files), 'file')} and {counted(len(directories), 'shard set')}")
    return ExitCode.OK
