"""The Batch API's SQLite queue has one owner: a second store on the same file (another
app, another local cluster on this machine) fails with a clear error rather than reset
the owner's running requests and serve its jobs; the owner's exit, however abrupt,
hands the file on."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.batch_store import BatchStore, BatchStoreInUse
from tests.live_app import wait_for


def _queue_one(store: BatchStore) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "p"}}
    upload = store.add_file(json.dumps(line).encode(), "in.jsonl", "batch", 0.0)
    store.create_batch(upload["id"], "/v1/completions", "24h", 0.0)


def test_a_second_store_on_an_owned_file_fails_and_leaves_the_owners_running_requests(tmp_path: Path) -> None:
    path = tmp_path / "batches.sqlite"
    owner = BatchStore(path)
    _queue_one(owner)
    (running,) = owner.pending(now_s=0.0)
    owner.mark_running(running)
    with pytest.raises(BatchStoreInUse, match=r"give each app its own `batch_api\.db_path`") as refused:
        BatchStore(path, owner_wait_s=0.3)
    assert str(path) in str(refused.value)
    assert owner.pending(now_s=0.0) == []  # still running: the refused store reset nothing
    owner.close()
    successor = BatchStore(path, owner_wait_s=0.3)  # a restart: what was running runs again
    assert [r.custom_id for r in successor.pending(now_s=0.0)] == ["a"]
    successor.close()


def test_an_owner_killed_outright_hands_the_file_on(tmp_path: Path) -> None:
    path = tmp_path / "batches.sqlite"
    held = tmp_path / "held"
    owner = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys, time; from app.batch_store import BatchStore; "
        f"s = BatchStore({str(path)!r}); pathlib.Path({str(held)!r}).touch(); time.sleep(600)")],
        cwd=Path(__file__).resolve().parents[3])
    try:
        wait_for(held.exists, 60, "the other process to own the queue file")
        with pytest.raises(BatchStoreInUse):
            BatchStore(path, owner_wait_s=0.3)
    finally:
        owner.kill()
        owner.wait()
    BatchStore(path, owner_wait_s=30).close()


def test_a_deferred_job_waits_for_its_release_and_an_old_file_gets_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "batches.sqlite"
    old = sqlite3.connect(str(path))  # a queue file written before deferral existed
    old.executescript("CREATE TABLE batches (id TEXT PRIMARY KEY, input_file_id TEXT, endpoint TEXT, "
                      "completion_window TEXT, status TEXT, created_at REAL, deadline_s REAL, completed_at REAL, "
                      "output_file_id TEXT, total INTEGER, completed INTEGER, failed INTEGER); "
                      "CREATE TABLE requests (batch_id TEXT, line INTEGER, custom_id TEXT, body TEXT, status TEXT, "
                      "response TEXT, enqueued_s REAL, deadline_s REAL, PRIMARY KEY (batch_id, line)); "
                      "INSERT INTO batches VALUES ('old', 'f', '/v1/completions', '24h', 'in_progress', 0, 86400, "
                      "NULL, NULL, 1, 0, 0); INSERT INTO requests VALUES ('old', 0, 'o', '{}', 'pending', NULL, 0, "
                      "86400);")
    old.close()
    store = BatchStore(path)
    assert [r.custom_id for r in store.pending(now_s=0.0)] == ["o"]  # released at once
    seen: list[tuple[int, float]] = []

    def release(lines: list, deadline_s: float) -> float:
        seen.append((len(lines), deadline_s))
        return 500.0

    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "p"}}
    upload = store.add_file(json.dumps(line).encode(), "in.jsonl", "batch", 0.0)
    batch = store.create_batch(upload["id"], "/v1/completions", "1h", 100.0, release)
    assert seen == [(1, 3700.0)] and batch["wattwise"] == {"release_at": 500.0}
    assert [r.custom_id for r in store.pending(now_s=499.0)] == ["o"]
    assert [r.custom_id for r in store.pending(now_s=500.0)] == ["a", "o"]  # earliest deadline first
    store.close()
