"""Shard files and the shard set: temporary names, rolling, checksums, and the swap.

Every file is written under a hidden temporary name that never ends in `.jsonl.zst`,
`.parquet`, `kp-shard.manifest` or `README.md` (`.<name>.tmp-<pid>`), fsynced, and renamed
only when the whole set is complete. The swap from an old set to a new one
(`ShardSet.commit`):

1. all new shards and the new manifest are complete under temporary names;
2. if a new shard would take the name of an existing file, the old manifest (and the old
   card) is removed first (so no manifest or card ever describes a file whose content is
   changing); otherwise the old manifest stays until step 4 replaces it atomically;
3. the new shards are renamed to their names, then the dataset card to `README.md`
   (card.py: a Hugging Face loader reads its file lists, which name only files that now
   exist);
4. the new manifest is renamed to `kp-shard.manifest` (and a set of older kimipipe loses
   its `manifest.json` right after: until then both exist and readers take the new one);
5. only then are the old set's shards that the new set does not reuse deleted. Their names
   are written to `DIR/.kp-shard-stale` before step 4, and the list is removed once they
   are gone: after a crash in between, the next run deletes those the current manifest
   does not list (a new set may have other names, so its own name pattern would miss them).

A crash at any point leaves either the old manifest with all of its files intact, the new
manifest with all of its files, or (between 2 and 4) no manifest at all; never a manifest
that names a missing or half-written file. Leftover temporary files are removed by the next
run in the same directory (an exclusive lock on `DIR/.kp-shard.lock` keeps two runs apart).

One module past 400 lines, on purpose: the crash-safety argument above is about the order
of renames, fsyncs and deletions across the shard writer and the set's commit, and it can
only be checked by reading them in one place.

The tests crash a real process at each step: with `KP_TEST_PAUSE_AT=STEP` in its
environment, kp-shard stops itself (SIGSTOP) at that step and the test kills it with
SIGKILL there, so no cleanup runs, as in a real crash. The steps, in order: `commit`
(every shard complete under its temporary name), `manifest-written`,
`old-manifest-removed`, `renamed-N` (after the N-th shard's rename), `card-renamed`, `shards-renamed`,
`manifest-swapped`, `deleted-N` (after the N-th stale shard's deletion).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import msgspec
import zstandard

from ..errors import KPError
from .formats import JSONL, PARQUET, SUFFIXES
from .manifest import ShardEntry, ShardFiles, ShardManifest
from .rows import Row

# The manifest's name ends in neither .json nor .jsonl: speculators' `prepare-data --data
# DIR` (and any trainer that globs a directory for JSON files) would read it as a row.
MANIFEST = "kp-shard.manifest"
# Sets of older kimipipe hold `manifest.json`: still read, verified and loaded; a rebuild
# replaces it with MANIFEST.
LEGACY_MANIFEST = "manifest.json"
CARD = "README.md"  # the dataset card (card.py), where the Hugging Face Hub looks for it
LOCK = ".kp-shard.lock"
STALE = ".kp-shard-stale"  # the old set's shards a swap has yet to delete (JSON list)
SHARD_SUFFIX = SUFFIXES[JSONL]
SHARD_SUFFIXES = tuple(SUFFIXES.values())  # every container's (str.endswith takes a tuple)
_SUFFIX_RE = "|".join(re.escape(x) for x in SHARD_SUFFIXES)
_TEMP = re.compile(rf"^\..+(?:{_SUFFIX_RE})\.tmp-\d+$|^\.{re.escape(MANIFEST)}\.tmp-\d+$"
                   r"|^\.README\.md\.tmp-\d+$"
                   r"|^\.kp-shard-spill-\d+$")  # our temporary names, and only those
_SYNC_EVERY = 16 << 20  # compressed bytes between background syncs of a shard
_JOB_SIZE = 0  # zstd picks it from the level (measured: smaller jobs were not faster)


def _pause_at(step: str) -> None:
    """The crash tests' hook (see the module docstring): one environment lookup a step."""
    if os.environ.get("KP_TEST_PAUSE_AT") == step:
        os.kill(os.getpid(), signal.SIGSTOP)


def manifest_path(directory: str) -> str:
    """The path of DIRECTORY's manifest: MANIFEST, or an older set's LEGACY_MANIFEST when
    only that exists (MANIFEST's path when neither does)."""
    path = os.path.join(directory, MANIFEST)
    legacy = os.path.join(directory, LEGACY_MANIFEST)
    return legacy if not os.path.exists(path) and os.path.exists(legacy) else path


def temp_name(final: str) -> str:
    return f".{final}.tmp-{os.getpid()}"


def shard_name(prefix: str, split: str, index: int, suffix: str = SHARD_SUFFIX) -> str:
    """`<prefix>-<split>-00000<suffix>`: the split's name stands between separators, where
    Hugging Face `datasets` looks for it when a directory has no card (`train`; `eval` it
    calls `test`)."""
    return f"{prefix}-{split}-{index:05d}{suffix}"


def shard_pattern(prefix: str) -> re.Pattern:
    """The names kp-shard owns in a directory of sets named PREFIX: this version's, and
    those of sets older versions wrote (`<prefix>-00000.jsonl.zst` for train rows)."""
    return re.compile(rf"^{re.escape(prefix)}-(?:(?:train|eval)-)?\d{{5,}}(?:{_SUFFIX_RE})$")


ShardInfo = ShardEntry  # a finished shard as the manifest lists it (manifest.py)
_files_decoder = msgspec.json.Decoder(ShardFiles)


class _HashingFile:
    """The file under the compressor: counts and hashes the compressed bytes as they pass.

    Every `_SYNC_EVERY` bytes it has the data written so far synced by a background thread
    (one at a time), so the fsync when the shard is finished has little left to wait for.
    """

    def __init__(self, path: str):
        self.f = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._unsynced = 0
        self._syncing: threading.Thread | None = None
        self._sync_error: OSError | None = None

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        n = self.f.write(data)
        self._unsynced += len(data)
        if self._unsynced >= _SYNC_EVERY and (self._syncing is None
                                              or not self._syncing.is_alive()):
            self._unsynced = 0
            self._syncing = threading.Thread(target=self._sync_behind, args=(self.f.fileno(),),
                                             name="kp-shard-sync", daemon=True)
            self._syncing.start()
        return n

    def _sync_behind(self, fd: int) -> None:
        try:
            os.fdatasync(fd)
        except OSError as e:  # reported by sync(): the error is consumed on this fd
            self._sync_error = e

    def flush(self) -> None:
        self.f.flush()

    def wait(self) -> None:
        """Wait for a background sync (before the file is synced for good or closed)."""
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None

    def sync(self) -> None:
        """Flush, and fsync: the file's content is on disk when this returns."""
        self.f.flush()
        self.wait()
        if self._sync_error is not None:
            raise self._sync_error
        os.fsync(self.f.fileno())


class OpenShard:
    """One shard being written: rows in, zstd out, under a temporary name."""

    def __init__(self, directory: str, name: str, split: str, cctx: zstandard.ZstdCompressor,
                 level: int = 3):
        self.name = name
        self.split = split
        self.tmp = os.path.join(directory, temp_name(name))
        self.final = os.path.join(directory, name)
        self._file = _HashingFile(self.tmp)
        self._zst = cctx.stream_writer(self._file, closefd=False)
        self.records = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.uncompressed = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, row: Row) -> None:
        # Straight into zstd: it copies into its own job buffers (multi-threaded zstd
        # compresses whole jobs of a few MB in worker threads), so no batching here.
        self._zst.write(row.data)
        self.uncompressed += len(row.data)
        self.records += 1
        self.input_tokens += row.input_tokens
        self.output_tokens += row.output_tokens

    def close(self) -> ShardInfo:
        self._zst.flush(zstandard.FLUSH_FRAME)
        self._zst.close()
        self._file.sync()
        self._file.f.close()
        return ShardInfo(self.name, self.split, self.records, self.input_tokens,
                         self.output_tokens, self._file.size, self.uncompressed,
                         self._file.sha256.hexdigest())

    def abandon(self) -> None:
        try:
            self._file.wait()
            self._file.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


class ParquetShardFile:
    """One Parquet shard being written (parquet.py), with OpenShard's attributes and calls:
    the row's `data` is its `input_ids` body (formats.ids_body)."""

    def __init__(self, directory: str, name: str, split: str, cctx: None, level: int = 3):
        from .parquet import ParquetShard

        self.name = name
        self.split = split
        self.tmp = os.path.join(directory, temp_name(name))
        self.final = os.path.join(directory, name)
        self._shard = ParquetShard(self.tmp, level)
        self.records = 0
        self.input_tokens = 0
        self.output_tokens = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, row: Row) -> None:
        self._shard.add(row.id, row.data, row.input_tokens, row.output_tokens)
        self.records += 1
        self.input_tokens += row.input_tokens
        self.output_tokens += row.output_tokens

    def close(self) -> ShardInfo:
        size, sha256 = self._shard.close()
        return ShardInfo(self.name, self.split, self.records, self.input_tokens,
                         self.output_tokens, size, self._shard.uncompressed, sha256)

    def abandon(self) -> None:
        self._shard.abandon()


_FILES = {JSONL: OpenShard, PARQUET: ParquetShardFile}


class ShardSequence:
    """The shards of one split: a new shard starts when the open one is full.

    A full shard is finished (its last zstd jobs compressed, fsynced) by a background
    thread while the next one fills, so shard boundaries do not stall the run. Two
    compressors take turns: a ZstdCompressor serves one stream at a time, and the one a
    new shard takes has finished the shard before last.
    """

    def __init__(self, owner: ShardSet, split: str):
        self.owner = owner
        self.split = split
        self.file_class = _FILES[owner.container]
        if owner.container == JSONL:
            params = zstandard.ZstdCompressionParameters.from_level(
                owner.level, threads=-1, job_size=_JOB_SIZE, write_checksum=True)
            self.cctxs = [zstandard.ZstdCompressor(compression_params=params) for _ in range(2)]
        else:
            self.cctxs = [None, None]
        self.closing: list[Future | None] = [None, None]
        self.open: OpenShard | None = None
        self.index = 0

    def add(self, row: Row) -> None:
        shard = self.open
        if shard is not None and self._full_with(shard, row):
            self._finish(shard)
            shard = self.open = None
        if shard is None:
            turn = self.index % 2
            if self.closing[turn] is not None:
                self.closing[turn].result()  # its compressor is free again
            name = shard_name(self.owner.prefix, self.split, self.index, SUFFIXES[self.owner.container])
            self.index += 1
            self.owner.started.append(name)
            shard = self.open = self.file_class(self.owner.directory, name, self.split,
                                                self.cctxs[turn], self.owner.level)
        shard.add(row)

    def _finish(self, shard: OpenShard) -> None:
        future = self.owner.closer.submit(shard.close)
        self.closing[(self.index - 1) % 2] = future
        self.owner.closing.append(future)

    def _full_with(self, shard: OpenShard, row: Row) -> bool:
        limit_records = self.owner.records_per_shard
        limit_tokens = self.owner.tokens_per_shard
        if limit_records is not None and shard.records >= limit_records:
            return True
        row_tokens = row.input_tokens + row.output_tokens
        return limit_tokens is not None and shard.tokens + row_tokens > limit_tokens

    def close(self) -> None:
        if self.open is not None:
            self._finish(self.open)
            self.open = None


class ShardSet:
    """A new set of shards in DIRECTORY, invisible until `commit`."""

    def __init__(self, directory: str, prefix: str, *, level: int = 3,
                 records_per_shard: int | None = None, tokens_per_shard: int | None = None,
                 container: str = JSONL):
        self.directory = directory
        self.prefix = prefix
        self.level = level
        self.container = container  # formats.JSONL or formats.PARQUET
        self.records_per_shard = records_per_shard
        self.tokens_per_shard = tokens_per_shard
        self.finished: list[ShardInfo] = []
        self.started: list[str] = []
        self.closing: list[Future] = []
        self.closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kp-shard-close")
        self._splits: dict[str, ShardSequence] = {}

    def add(self, split: str, row: Row) -> None:
        seq = self._splits.get(split)
        if seq is None:
            seq = self._splits[split] = ShardSequence(self, split)
        seq.add(row)

    def close(self) -> list[ShardInfo]:
        for seq in self._splits.values():
            seq.close()
        self.finished = [future.result() for future in self.closing]
        self.closer.shutdown()
        order = {"train": 0, "eval": 1}
        self.finished.sort(key=lambda s: (order.get(s.split, 2), s.file))
        return self.finished

    def discard(self) -> None:
        """Remove every temporary file of this set (after any shard being finished)."""
        for seq in self._splits.values():
            if seq.open is not None:
                seq.open.abandon()
                seq.open = None
        for future in self.closing:
            try:
                future.result()
            except Exception:
                pass  # the error that matters is already on its way up
        self.closer.shutdown()
        for name in (*self.started, CARD):
            tmp = os.path.join(self.directory, temp_name(name))
            if os.path.exists(tmp):
                os.unlink(tmp)

    def commit(self, manifest: ShardManifest, card: str | None = None) -> None:
        """Swap the finished set in for the old one (see the module docstring), with CARD
        as its README.md (None: the directory's README.md is left as it is)."""
        _pause_at("commit")
        d = self.directory
        card_tmp = None
        if card is not None:
            card_tmp = os.path.join(d, temp_name(CARD))
            write_synced(card_tmp, card)
        old = read_manifest_files(d)
        new_names = {s.file for s in self.finished}
        manifest_tmp = os.path.join(d, temp_name(MANIFEST))
        with open(manifest_tmp, "w") as f:
            # (json.dump of the builtins: the manifest's bytes as they always were)
            json.dump(msgspec.to_builtins(manifest), f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        _pause_at("manifest-written")
        current = manifest_path(d)  # (an older set's manifest.json, or ours)
        if any(os.path.exists(os.path.join(d, n)) for n in new_names) and os.path.exists(current):
            os.unlink(current)
            if card_tmp is not None and os.path.exists(os.path.join(d, CARD)):
                os.unlink(os.path.join(d, CARD))  # it names those files too
            fsync_dir(d)
            _pause_at("old-manifest-removed")
        for i, name in enumerate(sorted(new_names), 1):
            os.replace(os.path.join(d, temp_name(name)), os.path.join(d, name))
            _pause_at(f"renamed-{i}")
        if card_tmp is not None:
            os.replace(card_tmp, os.path.join(d, CARD))
            _pause_at("card-renamed")
        stale = {n for n in old if n not in new_names}
        stale_list = os.path.join(d, STALE)
        if stale:
            with open(stale_list, "w") as f:
                json.dump(sorted(stale), f)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(d)
        _pause_at("shards-renamed")
        os.replace(manifest_tmp, os.path.join(d, MANIFEST))
        legacy = os.path.join(d, LEGACY_MANIFEST)
        if os.path.exists(legacy):  # an older set's, now replaced (a crash before: both,
            os.unlink(legacy)       # and readers take MANIFEST)
        fsync_dir(d)
        _pause_at("manifest-swapped")
        mine = shard_pattern(self.prefix)
        stale |= {n for n in os.listdir(d) if mine.match(n) and n not in new_names}
        deleted = 0
        for name in sorted(stale):
            path = os.path.join(d, name)
            if os.path.isfile(path) and os.path.basename(name) == name:
                os.unlink(path)
                deleted += 1
                _pause_at(f"deleted-{deleted}")
        if os.path.exists(stale_list):
            os.unlink(stale_list)
        if stale:
            fsync_dir(d)


def write_synced(path: str, text: str) -> None:
    """PATH holds TEXT, on disk (fsynced), when this returns."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_manifest_files(directory: str) -> set[str]:
    """The shard file names the current manifest in DIRECTORY lists (none if unreadable)."""
    try:
        with open(manifest_path(directory), "rb") as f:
            listed = _files_decoder.decode(f.read())
        return {s.file for s in listed.shards}
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return set()


def finish_stale_deletions(directory: str) -> None:
    """Delete what an interrupted swap left of the old set (see `STALE`): the names listed
    that the current manifest does not list (none, before that swap reached its step 4)."""
    path = os.path.join(directory, STALE)
    try:
        with open(path) as f:
            names = json.load(f)
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        names = []
    keep = read_manifest_files(directory)
    for name in names if isinstance(names, list) else []:
        if (isinstance(name, str) and name.endswith(SHARD_SUFFIXES) and name not in keep
                and os.path.basename(name) == name):
            target = os.path.join(directory, name)
            if os.path.isfile(target):
                os.unlink(target)
    os.unlink(path)
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryLock:
    """One kp-shard run per output directory; leftovers of crashed runs are removed on entry."""

    def __init__(self, directory: str):
        self.directory = directory
        self._fd: int | None = None

    def __enter__(self) -> DirectoryLock:
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._fd = os.open(os.path.join(self.directory, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise KPError(f"{self.directory}: cannot use as the output directory: {e.strerror}",
                          exit_code=2) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise KPError(f"{self.directory}: another kp-shard is writing here", exit_code=2) from None
        for name in os.listdir(self.directory):
            if _TEMP.match(name):
                path = os.path.join(self.directory, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
        finish_stale_deletions(self.directory)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
