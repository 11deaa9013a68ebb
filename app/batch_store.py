"""Durable store behind the OpenAI-compatible Batch API (SQLite).

Files, batches and one row per batch request live on disk, so a restart of the app
loses no accepted request: requests that were in flight when it stopped go back to
pending and run again (at least once); each request's result is written once, when
it finishes, and the output file is assembled from those rows.

One queue owns a file: a second store on the same path (another app, or another local
cluster on this machine) would reset the first one's running requests to pending and
serve its jobs, so it waits for the owner's lock and then fails with a clear error.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

WINDOWS_S = {"24h": 24 * 3600.0, "1h": 3600.0}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, purpose TEXT, filename TEXT, bytes INTEGER,
    created_at REAL, content BLOB);
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, input_file_id TEXT, endpoint TEXT,
    completion_window TEXT, status TEXT, created_at REAL, deadline_s REAL, completed_at REAL,
    output_file_id TEXT, total INTEGER, completed INTEGER, failed INTEGER);
CREATE TABLE IF NOT EXISTS requests (batch_id TEXT, line INTEGER, custom_id TEXT, body TEXT,
    status TEXT, response TEXT, enqueued_s REAL, deadline_s REAL, PRIMARY KEY (batch_id, line));
CREATE INDEX IF NOT EXISTS pending ON requests (status, deadline_s, enqueued_s);
"""
# Columns added since the first schema: (table, column, its definition). A file written
# before them gets them when opened (its jobs: released at once).
_ADDED = (("requests", "release_s", "REAL NOT NULL DEFAULT 0"), ("batches", "release_s", "REAL NOT NULL DEFAULT 0"))
# The queue holds a job's lines until its release (app.batch_deferral): given the job's lines
# (custom_id, body) and its deadline, when to release them.
Release = Callable[[list[tuple[str, dict[str, Any]]], float], float]


class BatchInputError(ValueError):
    """The uploaded JSONL or the batch request is not usable; the message says why."""


class BatchStoreInUse(RuntimeError):
    """Another process's queue owns this SQLite file."""


OWNER_WAIT_S = 60.0  # Serve stops an updated replica (graceful shutdown up to 20 s) before starting its successor


def _own(path: Path, wait_s: float) -> TextIO:
    """An exclusive lock on `path`'s queue, held while the returned file stays open (the OS
    drops it when the process exits, however it exits)."""
    lock = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 (open while the store lives)
    deadline_s = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError:
            if time.monotonic() >= deadline_s:
                lock.close()
                raise BatchStoreInUse(
                    f"The batch queue file {path} is in use by another wattwise app (or another local cluster) "
                    f"on this node; give each app its own `batch_api.db_path`.") from None
            time.sleep(0.2)


@dataclass(frozen=True)
class PendingRequest:
    batch_id: str
    line: int
    custom_id: str
    body: dict[str, Any]
    enqueued_s: float
    deadline_s: float


class BatchStore:
    def __init__(self, path: str | Path, owner_wait_s: float = OWNER_WAIT_S) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = _own(path, owner_wait_s)  # before the reset below touches another owner's rows
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)
        for table, column, definition in _ADDED:
            if column not in {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        # A restart: whatever was running did not finish; run it again.
        self.db.execute("UPDATE requests SET status='pending' WHERE status='running'")

    def close(self) -> None:
        """Close the file and give up its ownership (another store may then open it)."""
        self.db.close()
        self._lock.close()

    # ---- files ---------------------------------------------------------------------
    def add_file(self, content: bytes, filename: str, purpose: str, now_s: float) -> dict[str, Any]:
        file_id = f"file-{uuid.uuid4().hex}"
        self.db.execute("INSERT INTO files VALUES (?,?,?,?,?,?)",
                        (file_id, purpose, filename, len(content), now_s, content))
        row = self.file(file_id)
        assert row is not None  # just inserted
        return row

    def file(self, file_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id, purpose, filename, bytes, created_at FROM files WHERE id=?",
                              (file_id,)).fetchone()
        if row is None:
            return None
        return {"id": row[0], "object": "file", "purpose": row[1], "filename": row[2], "bytes": row[3],
                "created_at": int(row[4]), "status": "processed"}

    def file_content(self, file_id: str) -> bytes | None:
        row = self.db.execute("SELECT content FROM files WHERE id=?", (file_id,)).fetchone()
        return None if row is None else bytes(row[0])

    # ---- batches -------------------------------------------------------------------
    def create_batch(self, input_file_id: str, endpoint: str, completion_window: str, now_s: float,
                     release: Release | None = None) -> dict:
        """The job, its lines queued until `release` says (None: at once)."""
        content = self.file_content(input_file_id)
        if content is None:
            raise BatchInputError(f"no file {input_file_id!r}")
        if completion_window not in WINDOWS_S:
            raise BatchInputError(f"completion_window must be one of {sorted(WINDOWS_S)}")
        lines = _parse_jsonl(content, endpoint)
        batch_id = f"batch_{uuid.uuid4().hex}"
        deadline = now_s + WINDOWS_S[completion_window]
        release_s = now_s if release is None else release(lines, deadline)
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("INSERT INTO batches (id, input_file_id, endpoint, completion_window, status, created_at, "
                            "deadline_s, completed_at, output_file_id, total, completed, failed, release_s) "
                            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                            (batch_id, input_file_id, endpoint, completion_window, "in_progress", now_s, deadline,
                             None, None, len(lines), 0, 0, release_s))
            self.db.executemany(
                "INSERT INTO requests (batch_id, line, custom_id, body, status, response, enqueued_s, deadline_s, "
                "release_s) VALUES (?,?,?,?,?,?,?,?,?)",
                [(batch_id, i, cid, json.dumps(body), "pending", None, now_s, deadline, release_s)
                 for i, (cid, body) in enumerate(lines)])
        row = self.batch(batch_id)
        assert row is not None  # just inserted
        return row

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id, input_file_id, endpoint, completion_window, status, created_at, deadline_s, "
                              "completed_at, output_file_id, total, completed, failed, release_s FROM batches "
                              "WHERE id=?", (batch_id,)).fetchone()
        if row is None:
            return None
        (bid, input_file_id, endpoint, window, status, created, deadline, completed_at, output_file_id, total,
         done, failed, release_s) = row
        return {
            "id": bid, "object": "batch", "endpoint": endpoint, "input_file_id": input_file_id,
            "completion_window": window, "status": status, "created_at": int(created),
            "expires_at": int(deadline), "completed_at": None if completed_at is None else int(completed_at),
            "output_file_id": output_file_id, "error_file_id": None, "errors": None,
            "request_counts": {"total": total, "completed": done, "failed": failed},
            # When the queue releases the job's lines (later than created_at: deferred to a cleaner hour).
            "wattwise": {"release_at": release_s},
        }

    # ---- the queue -----------------------------------------------------------------
    def pending(self, now_s: float, limit: int | None = None) -> list[PendingRequest]:
        """Pending requests released by `now_s`, earliest deadline first, FCFS within a deadline."""
        sql = ("SELECT batch_id, line, custom_id, body, enqueued_s, deadline_s FROM requests "
               "WHERE status='pending' AND release_s <= ? ORDER BY deadline_s, enqueued_s, line")
        rows = self.db.execute(sql + (f" LIMIT {int(limit)}" if limit else ""), (now_s,)).fetchall()
        return [PendingRequest(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5]) for r in rows]

    def mark_running(self, req: PendingRequest) -> None:
        self.db.execute("UPDATE requests SET status='running' WHERE batch_id=? AND line=?", (req.batch_id, req.line))

    def finish(self, req: PendingRequest, response: dict[str, Any], ok: bool, now_s: float) -> None:
        """Record one result; completes the batch (writes its output file) with the last one."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("UPDATE requests SET status=?, response=? WHERE batch_id=? AND line=?",
                            ("done" if ok else "failed", json.dumps(response), req.batch_id, req.line))
            column = "completed" if ok else "failed"
            self.db.execute(f"UPDATE batches SET {column}={column}+1 WHERE id=?", (req.batch_id,))
            left = self.db.execute("SELECT COUNT(*) FROM requests WHERE batch_id=? AND status IN ('pending','running')",
                                   (req.batch_id,)).fetchone()[0]
            if left == 0:
                self._complete(req.batch_id, now_s)

    def _complete(self, batch_id: str, now_s: float) -> None:
        rows = self.db.execute("SELECT custom_id, response, status FROM requests WHERE batch_id=? ORDER BY line",
                               (batch_id,)).fetchall()
        out = "".join(json.dumps({"id": f"batch_req_{batch_id}_{i}", "custom_id": cid,
                                  "response": json.loads(resp) if status == "done" else None,
                                  "error": None if status == "done" else json.loads(resp)}) + "\n"
                      for i, (cid, resp, status) in enumerate(rows))
        file_id = f"file-{uuid.uuid4().hex}"
        self.db.execute("INSERT INTO files VALUES (?,?,?,?,?,?)",
                        (file_id, "batch_output", f"{batch_id}_output.jsonl", len(out), now_s, out.encode()))
        self.db.execute("UPDATE batches SET status='completed', completed_at=?, output_file_id=? WHERE id=?",
                        (now_s, file_id, batch_id))


def _parse_jsonl(content: bytes, endpoint: str) -> list[tuple[str, dict[str, Any]]]:
    lines = []
    for n, raw in enumerate(content.decode("utf-8", errors="strict").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BatchInputError(f"line {n}: not JSON ({exc})") from None
        if not isinstance(item, dict) or "custom_id" not in item or not isinstance(item.get("body"), dict):
            raise BatchInputError(f"line {n}: needs custom_id and an object body")
        if item.get("url", endpoint) != endpoint:
            raise BatchInputError(f"line {n}: url {item.get('url')!r} differs from the batch endpoint {endpoint!r}")
        lines.append((str(item["custom_id"]), item["body"]))
    if not lines:
        raise BatchInputError("the input file holds no requests")
    return lines
