"""The translation cache: an LRU in memory, bounded in bytes, with an opt-in SQLite file.

A hit is out at once and costs no backend, even one that is down. A key names everything
that changes the output (the backend's identity, source, target, text, and for a backend
that reads a segment's context that context's digest, ``context_mark``), so no answer is
served for an input it was not made from. The file stores the text's digest, never the
text.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import sqlite3
import stat
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from service.exceptions import ConfigError
from service.ops.metrics import Metrics

log = logging.getLogger("thinktrans.cache")

CacheKey = tuple[str, str | None, str, str]  # (identity, source, target, text)

# Memory charged per entry beyond its strings: the OrderedDict's slot (hash table entry,
# index and linked-list node), the key tuple and the CachedTranslation. Measured with
# tracemalloc on CPython 3.11 by inserting 1,000 to 400,000 entries whose strings were
# allocated beforehand: 205 to 236 bytes per entry, the most just after the table grows;
# rounded up.
_ENTRY_OVERHEAD = 240
# Disk charged per row beyond its text, model and 64-character digest: the cell headers,
# the primary key's index (which repeats the digest) and the index on ``created``.
# Measured as (file size - payload) / rows after inserting 5,000 rows of 20 and 100 byte
# translations and checkpointing: 116 and 128 bytes. Longer rows leave more of a page
# unused, so the file itself may run past the rows' total by that slack.
_ROW_OVERHEAD = 128
_DIGEST_CHARS = 64
_FLUSH_INTERVAL_S = 0.5
# With nothing to write, expired rows are still deleted this often: reads skip them
# anyway, so this is housekeeping, not correctness.
_PRUNE_INTERVAL_S = 60.0
# After a checkpoint, a WAL that a large flush grew past this is cut back to it, rather
# than kept at its high-water mark.
_WAL_LIMIT_BYTES = 4 << 20
_READ_TIMEOUT_S = 0.05  # a read on the loop gives up (a miss) rather than wait
_WRITE_TIMEOUT_S = 5.0  # the writer waits for another process holding the file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS translations (
    digest TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    model TEXT,
    created REAL NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS translations_created ON translations (created);
"""

_Row = tuple[str, str, str | None, float, int]  # digest, text, model, created, size


@dataclass(frozen=True, slots=True)
class CachedTranslation:
    """A translation the cache holds, with the model that made it."""

    text: str
    model: str | None


def key_digest(key: CacheKey) -> str:
    """SHA-256 hex digest of a key. Each part is length-prefixed and None has its own mark,
    so no two keys share an encoding; lone surrogates (valid JSON escapes) are hashed as
    they are rather than refused."""
    h = hashlib.sha256()
    for part in key:
        if part is None:
            h.update(b"\xff")
            continue
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def context_mark(context: str | None) -> str:
    """The part of a cache identity that names the context a backend was given with a
    text: its SHA-256 (128 bits of it), or ``none``. A context steers what a model
    answers, an instruction planted in it included; keyed, an answer is only ever served
    for the input it was made from."""
    if context is None:
        return "ctx=none"
    digest = hashlib.sha256(context.encode("utf-8", "surrogatepass")).hexdigest()
    return f"ctx={digest[:32]}"


def _entry_bytes(key: CacheKey, value: CachedTranslation) -> int:
    identity, source, target, text = key
    size = _ENTRY_OVERHEAD + sys.getsizeof(identity) + sys.getsizeof(target)
    size += sys.getsizeof(text) + sys.getsizeof(value.text)
    # None is a shared singleton: it costs an entry nothing.
    if source is not None:
        size += sys.getsizeof(source)
    if value.model is not None:
        size += sys.getsizeof(value.model)
    return size


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _newest_within(rows: list[_Row], max_bytes: int) -> list[_Row]:
    """The newest rows that total at most ``max_bytes`` (a flush bigger than the file)."""
    kept: list[_Row] = []
    room = max_bytes
    for row in sorted(rows, key=lambda row: row[3], reverse=True):
        if row[4] <= room:
            kept.append(row)
            room -= row[4]
    return kept


class Unusable(OSError):
    """The cache path names something that is not to be opened as the cache's file."""


def _open_private(path: Path) -> int:
    """A descriptor of the file at ``path``, created (mode 0600) if it is not there, never
    through a symbolic link, and checked to be a regular file that is empty or SQLite's.

    Created here rather than by SQLite so that it is never readable by others, even for
    a moment (SQLite gives its -wal and -shm files the same mode). ``O_NOFOLLOW`` refuses
    a link as the last component in the same call that creates the file, where a check
    before the open would leave a moment to put one there. A file that is not SQLite's
    (notes, a log) is refused before SQLite would call it "not a database", and before
    anything about it changes.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    if not hasattr(os, "O_NOFOLLOW") and path.is_symlink():  # no such flag: check first
        raise Unusable(_SYMLINK)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        # ELOOP (Linux, macOS) or EMLINK (FreeBSD) is how O_NOFOLLOW refuses a link.
        if exc.errno in (errno.ELOOP, errno.EMLINK) and path.is_symlink():
            raise Unusable(_SYMLINK) from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device (O_NONBLOCK: no wait)
            raise Unusable("is not a regular file: point it to a file of the cache's own")
        header = os.read(fd, len(_SQLITE_HEADER))  # just opened: from the start
        if header and header != _SQLITE_HEADER:
            raise Unusable("is not an SQLite file, and was left as it is: point it to a "
                           "file of the cache's own")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _only_ours(db: sqlite3.Connection) -> None:
    """Refuse a database that holds tables of some other program's: the cache would add
    its own beside them, write them in WAL mode and trim nothing of theirs."""
    tables = [row[0] for row in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()]
    others = sorted(set(tables) - {"translations"})
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise Unusable(f"is another program's database (tables {shown}), and was left as "
                       "it is: point it to a file of the cache's own")


def _connect(path: Path, made: os.stat_result, timeout_s: float) -> sqlite3.Connection:
    """SQLite's connection to the file ``_open_private`` opened, checked to be that file.

    SQLite opens by name and follows a link at the last component (it resolves the name
    first, so that its -wal file lies beside the target), with no way to ask it not to
    from Python; so what it opened is checked afterwards: the file at the name SQLite
    resolved (``PRAGMA database_list``) must be the one made. A link put in the file's
    place between the two opens is found here, before anything is written through it,
    even if it is taken away again.
    """
    db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
    try:
        opened = next(row[2] for row in db.execute("PRAGMA database_list") if row[1] == "main")
        found = os.stat(opened, follow_symlinks=False)
        if (found.st_dev, found.st_ino) != (made.st_dev, made.st_ino):
            raise Unusable(_SYMLINK if path.is_symlink() else
                           "was replaced while it was being opened: keep it in a directory "
                           "only this service can write")
    except BaseException:
        db.close()
        raise
    return db


_SYMLINK = "is a symbolic link, which is not followed: point it to the file itself"
_SQLITE_HEADER = b"SQLite format 3\x00"


class _Store:
    """The SQLite file.

    Two connections rather than one behind a lock: in WAL mode a reader sees the last
    commit without waiting for a writer, so a lookup on the loop never stalls behind a
    flush in the worker thread, which a shared lock would make it do. The reader is used
    only from the loop's thread and the writer by one flush at a time; both are opened in
    a worker thread, hence ``check_same_thread=False``.
    """

    def __init__(self, path: Path, max_bytes: int, ttl_s: float) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.total = 0  # sum of the rows' size column, as last committed
        self.rows = 0
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None

    def open(self, now: float) -> None:
        """Create the file (mode 0600) and its schema, check them, drop stale rows."""
        writer = self.connect()
        total = writer.execute("SELECT COALESCE(SUM(size), 0) FROM translations").fetchone()
        self.total = int(total[0])
        self.write([], now)  # max_bytes or ttl_s may be smaller than last time
        self.rows = writer.execute("SELECT COUNT(*) FROM translations").fetchone()[0]

    def connect(self) -> sqlite3.Connection:
        """Create the file (mode 0600) and its schema, check them; the writer."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = _open_private(self.path)
        try:
            made = os.fstat(fd)
            self._writer = writer = _connect(self.path, made, _WRITE_TIMEOUT_S)
            _only_ours(writer)
            # A file that was there already (made by hand, or by an older run) is made
            # private too, through the descriptor: a link swapped in meanwhile has nothing
            # changed behind it. Before WAL mode, whose files take the file's mode.
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)  # no statement is open: no lock of SQLite's goes with it
        mode = writer.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"WAL journal mode not available (got {mode})")
        # In WAL mode NORMAL keeps the file consistent; a power cut may lose the last
        # flushes, which a cache can afford, and a commit need not wait for the disk.
        writer.execute("PRAGMA synchronous=NORMAL")
        writer.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT_BYTES}")
        writer.executescript(_SCHEMA)
        # A table of that name made by something else fails here, not on the first read.
        writer.execute("SELECT digest, text, model, created, size FROM translations LIMIT 0")
        self._reader = reader = _connect(self.path, made, _READ_TIMEOUT_S)
        reader.execute("PRAGMA query_only=ON")
        return writer

    def read(self, digest: str, now: float) -> CachedTranslation | None:
        if self._reader is None:
            return None
        try:
            row = self._reader.execute(
                "SELECT text, model FROM translations WHERE digest = ? AND created >= ?",
                (digest, now - self.ttl_s),
            ).fetchone()
        except sqlite3.Error as exc:  # busy or damaged: a miss, not a failed request
            log.warning("cache read failed", extra={"digest": digest[:12], "error": str(exc)})
            return None
        return None if row is None else CachedTranslation(row[0], row[1])

    def write(self, rows: list[_Row], now: float) -> None:
        """Delete expired rows, make room, insert ``rows``: one transaction.

        Room is made before inserting so that the rows never total more than
        ``max_bytes``, not even inside the transaction, and the file need not grow past
        that to hold a flush: the pages freed are reused by the rows that follow.
        """
        assert self._writer is not None
        db = self._writer
        rows = _newest_within(rows, self.max_bytes)
        db.execute("BEGIN IMMEDIATE")
        try:
            total = self._expire(db, now, self.total)
            total = self._replace(db, rows, total)
            total = self._trim(db, self.max_bytes - sum(row[4] for row in rows), total)
            db.executemany("INSERT INTO translations VALUES (?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # some errors (a full disk) have rolled it back already
                db.execute("ROLLBACK")
            raise
        self.total = total + sum(row[4] for row in rows)

    def _expire(self, db: sqlite3.Connection, now: float, total: int) -> int:
        cutoff = (now - self.ttl_s,)
        expired = db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM translations WHERE created < ?", cutoff
        ).fetchone()[0]
        db.execute("DELETE FROM translations WHERE created < ?", cutoff)
        return total - int(expired)

    @staticmethod
    def _replace(db: sqlite3.Connection, rows: list[_Row], total: int) -> int:
        """Delete the rows about to be written again; the total is kept without a scan."""
        for row in rows:
            old = db.execute("SELECT size FROM translations WHERE digest = ?", row[:1]).fetchone()
            if old is not None:
                db.execute("DELETE FROM translations WHERE digest = ?", row[:1])
                total -= int(old[0])
        return total

    @staticmethod
    def _trim(db: sqlite3.Connection, room: int, total: int) -> int:
        """Delete the oldest rows until they total at most ``room``."""
        if total <= room:
            return total
        doomed: list[tuple[str]] = []
        oldest = db.execute("SELECT digest, size FROM translations ORDER BY created")
        for digest, size in oldest:
            doomed.append((digest,))
            total -= int(size)
            if total <= room:
                break
        oldest.close()
        db.executemany("DELETE FROM translations WHERE digest = ?", doomed)
        return total

    def close(self) -> None:
        # The writer last: closing the last connection checkpoints the WAL into the file.
        for db in (self._reader, self._writer):
            if db is not None:
                db.close()
        self._reader = self._writer = None


def _unusable(path: str, exc: OSError | sqlite3.Error) -> ConfigError:
    """The one line a cache path that cannot be used is refused with."""
    if isinstance(exc, Unusable):
        return ConfigError(f"THINKTRANS_CACHE_PATH={path!r} {exc}, or unset it")
    return ConfigError(f"THINKTRANS_CACHE_PATH={path!r} cannot be used: {_one_line(exc)}; "
                       "point it to a writable SQLite file, or unset it")


def check_file(path: str) -> None:
    """Open the cache file at ``path`` as ``TranslationCache.start`` does, and close it: a
    ConfigError in one line where it cannot be used. For ``serve`` to call before the
    server starts, since the cache opens in the app's lifespan, where a failure is a
    traceback and uvicorn's exit 3. Creates the file (and its schema) if it is not there,
    as the cache would a moment later; changes no row."""
    store = _Store(Path(path).expanduser(), 0, 1.0)
    try:
        store.connect()
    except (OSError, sqlite3.Error) as exc:
        raise _unusable(path, exc) from exc
    finally:
        store.close()


class TranslationCache:
    """Translations by key, in memory within ``max_bytes``, and in ``path`` if given.

    Used from the event loop's thread only: ``get`` and ``put`` are plain calls, cheap
    enough inline. Memory is trimmed by use (an entry is charged ``_entry_bytes``, which
    counts shared strings for each entry and so leans high; ``ttl_s`` does not apply to
    it); the file by age and size. A file lookup is an indexed read on the loop thread
    (microseconds); writes never run on the loop: ``put`` queues a row, and a writer task
    hands the queue to a worker thread every ``_FLUSH_INTERVAL_S``. ``aclose`` flushes what
    is queued, so a restart serves every translation that was put.
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        path: str | None = None,
        ttl_s: float,
        metrics: Metrics | None = None,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if not ttl_s > 0:  # written so that NaN fails too
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.max_bytes = max_bytes
        self.path = path
        self.ttl_s = ttl_s
        self.enabled = max_bytes > 0
        self.metrics = metrics
        self.hits = 0
        self.misses = 0
        self.bytes = 0
        self._entries: OrderedDict[CacheKey, CachedTranslation] = OrderedDict()
        self._store: _Store | None = None
        # Rows waiting for the writer, and those it is writing now: both are still
        # served, as their entries may have left memory before reaching the file.
        self._pending: dict[str, _Row] = {}
        self._flushing: dict[str, _Row] = {}
        self._pruned_at = 0.0
        self._stopping: asyncio.Event | None = None
        self._writer_task: asyncio.Task[None] | None = None

    @property
    def entries(self) -> int:
        return len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # -- lookups ---------------------------------------------------------------------------

    def get(self, key: CacheKey) -> CachedTranslation | None:
        """The translation for ``key``, from memory or else the file; counts a hit or a miss."""
        if not self.enabled:
            return None
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        else:
            found = self._from_file(key)
        if found is not None:
            self.hits += 1
            if self.metrics is not None:
                self.metrics.cache_hits.inc()
        else:
            self.misses += 1
            if self.metrics is not None:
                self.metrics.cache_misses.inc()
        return found

    def _from_file(self, key: CacheKey) -> CachedTranslation | None:
        if self._store is None:
            return None
        digest = key_digest(key)
        row = self._pending.get(digest) or self._flushing.get(digest)
        if row is not None:
            found: CachedTranslation | None = CachedTranslation(row[1], row[2])
        else:
            found = self._store.read(digest, time.time())
        if found is not None:
            self._remember(key, found)
        return found

    def put(self, key: CacheKey, text: str, model: str | None) -> None:
        """Keep a translation: in memory now, in the file at the next flush."""
        if not self.enabled:
            return
        value = CachedTranslation(text, model)
        if self._remember(key, value) and self._store is not None:
            self._queue(key, value)

    # -- memory ----------------------------------------------------------------------------

    def _remember(self, key: CacheKey, value: CachedTranslation) -> bool:
        """Store in memory, evicting the least recently used; False if it cannot fit."""
        old = self._entries.pop(key, None)
        if old is not None:  # replaced, or dropped when the new value is too big
            self.bytes -= _entry_bytes(key, old)
        size = _entry_bytes(key, value)
        stored = size <= self.max_bytes
        if stored:
            while self.bytes + size > self.max_bytes:
                evicted, gone = self._entries.popitem(last=False)
                self.bytes -= _entry_bytes(evicted, gone)
            self._entries[key] = value
            self.bytes += size
        if self.metrics is not None:
            self.metrics.cache_bytes.set(self.bytes)
            self.metrics.cache_entries.set(len(self._entries))
        return stored

    # -- file ------------------------------------------------------------------------------

    def _queue(self, key: CacheKey, value: CachedTranslation) -> None:
        try:
            payload = len(value.text.encode()) + len((value.model or "").encode())
        except UnicodeEncodeError:
            return  # a lone surrogate, which SQLite cannot store: kept in memory only
        size = payload + _DIGEST_CHARS + _ROW_OVERHEAD
        if size > self.max_bytes:
            return  # the prune would delete it at once
        digest = key_digest(key)
        self._pending[digest] = (digest, value.text, value.model, time.time(), size)

    async def start(self) -> None:
        """Open the file, if there is one, and start the writer."""
        if not self.enabled or self.path is None or self._store is not None:
            return
        store = _Store(Path(self.path).expanduser(), self.max_bytes, self.ttl_s)
        try:
            await asyncio.to_thread(store.open, time.time())
        except (OSError, sqlite3.Error) as exc:
            await asyncio.to_thread(store.close)
            raise _unusable(self.path, exc) from exc
        self._store = store
        self._pruned_at = time.time()
        log.info("translation cache file open", extra={
            "path": str(store.path), "rows": store.rows, "row_bytes": store.total,
        })
        self._stopping = asyncio.Event()
        self._writer_task = asyncio.create_task(self._write_loop(), name="cache:writer")

    async def aclose(self) -> None:
        """Write what is queued and close the file."""
        if self._writer_task is not None and self._stopping is not None:
            self._stopping.set()
            await self._writer_task  # its last turn flushes the queue
            self._writer_task = None
        if self._store is not None:
            store, self._store = self._store, None
            await asyncio.to_thread(store.close)  # closing checkpoints the WAL: a write

    async def _write_loop(self) -> None:
        # Stopped by an event rather than cancelled, so that a flush is never cut off
        # while its thread goes on with the connection; the last turn flushes.
        stopping = self._stopping
        assert stopping is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), _FLUSH_INTERVAL_S)
            await self._flush()
            if stopping.is_set():  # checked after the flush: what was queued is written
                return

    async def _flush(self) -> None:
        now = time.time()
        store = self._store
        if store is None or (not self._pending and now - self._pruned_at < _PRUNE_INTERVAL_S):
            return
        self._flushing, self._pending = self._pending, {}
        try:
            await asyncio.to_thread(store.write, list(self._flushing.values()), now)
        except (OSError, sqlite3.Error) as exc:
            # The translations stay in memory; only their copy on disk is lost.
            log.warning("cache write failed", extra={
                "rows": len(self._flushing), "error": _one_line(exc),
            })
        finally:
            self._flushing = {}
        self._pruned_at = now

    # -- reports ---------------------------------------------------------------------------

    def info(self) -> dict[str, object]:
        lookups = self.hits + self.misses
        return {
            "enabled": self.enabled,
            "entries": len(self._entries),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hits / lookups, 4) if lookups else None,
            "persistent": self.enabled and self.path is not None,
            "path": self.path,
            "ttl_s": self.ttl_s,
        }
