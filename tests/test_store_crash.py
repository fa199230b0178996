"""A process killed (SIGKILL) at any point of writing or erasing a dataset's file leaves, once
the service has started again, no file without its row and no row without its file, on both
store backends. Each crash point is reached deterministically: a subprocess runs the store
with the step after the point replaced by ``os.kill(getpid(), SIGKILL)``, so none of its
exception handlers or cleanups run, as with a real kill -9."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _service import PG_URLS, env, make_app, open_store, upload_body
from fastapi.testclient import TestClient

SRC = Path(__file__).resolve().parents[1] / "src"

# argv: store target, files folder, crash point. Prints nothing; dies at the point.
CRASH = r"""
import contextlib, json, os, signal, sys
from rapt.service import auth
from rapt.service.store import Store, connection, datasets as ds_mod

target, files, point, rows = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
store = Store(target, files=files)
kid = store.add_key("crash", auth.hash_key(auth.new_key()))


def die(*_a, **_k):
    os.kill(os.getpid(), signal.SIGKILL)


def create():
    return store.create_dataset(kid, "tiny", rows["input_ids"], rows["labels"], 2,
                                {"mechanism": "none"}, None)


if point == "written":  # the data is on disk; its row's transaction has not committed
    real_write = ds_mod.write_private
    ds_mod.write_private = lambda path, data: (real_write(path, data), die())
    create()
elif point == "committed":  # the transaction that wrote the data has just committed
    real_tx, armed = connection.StoreBase._tx, []
    real_write = ds_mod.write_private
    ds_mod.write_private = lambda path, data: (armed.append(1), real_write(path, data))

    @contextlib.contextmanager
    def tx(self):
        with real_tx(self) as conn:
            yield conn
        if armed:
            die()

    connection.StoreBase._tx = tx
    create()
elif point == "deleted":  # the row is gone; its file is not erased yet
    did = create()
    ds_mod.erase_file = die
    store.delete_dataset(did, kid)
elif point == "purged":  # the key's rows are gone; their files are not erased yet
    create()
    connection.erase_file = die
    store.purge_key(kid)
print("the crash point was never reached")
"""


def _crash(tmp_path: Path, point: str, body: dict) -> None:
    target = PG_URLS.get(tmp_path) or str(tmp_path / "svc.db")
    rows = json.dumps({"input_ids": body["input_ids"], "labels": body["labels"]})
    e = {**env(), "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC),
                                                              os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", CRASH, target, str(tmp_path / "svc.db.files"),
                        point, rows], env=e, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr[-3000:])


@pytest.mark.parametrize("point,rows_left", [("written", 0), ("committed", 1),
                                             ("deleted", 0), ("purged", 0)])
def test_a_kill_at_any_point_leaves_no_file_without_its_row(tmp_path, tiny_bert, backend,
                                                            caplog, point, rows_left):
    """Old behaviour: the file was written under its own name before the commit, and a
    deleted dataset's file was erased after it; a kill in either window left a tenant's token
    ids in a file that no listing, quota or purge ever saw again."""
    body = upload_body(n=5)
    _crash(tmp_path, point, body)
    folder = tmp_path / "svc.db.files" / "datasets"
    assert any(folder.iterdir())  # the crash left a file behind
    with caplog.at_level(logging.WARNING, logger="rapt.service"), \
            TestClient(make_app(tmp_path, tiny_bert)):  # the service starts again
        pass
    store = open_store(tmp_path)
    try:
        live = [r["id"] for r in store._rows("SELECT id FROM datasets WHERE deleted IS NULL")]
        assert len(live) == rows_left
        assert sorted(p.name for p in folder.iterdir()) == sorted(f"{d}.json" for d in live)
        for did in live:  # the committed dataset is whole
            data = store.dataset_data(did)
            assert data["input_ids"] == body["input_ids"] and data["labels"] == body["labels"]
    finally:
        store.close()
    if rows_left == 0:
        assert "erased" in caplog.text and "no dataset row owns" in caplog.text


def test_reconciliation_waits_for_an_upload_between_its_file_and_its_commit(tmp_path,
                                                                            backend,
                                                                            monkeypatch):
    """A second process starting while an upload is between writing its file and committing
    its row (several API processes share a PostgreSQL store) must not take that file for a
    crash's: the reconciliation waits for the upload's transaction, then leaves it whole."""
    import threading

    from rapt.service import auth
    from rapt.service.store import datasets as ds_mod

    body = upload_body(n=4)
    uploader = open_store(tmp_path)
    kid = uploader.add_key("alice", auth.hash_key(auth.new_key()))
    written, go = threading.Event(), threading.Event()
    real_write = ds_mod.write_private

    def paused_write(path, data):
        real_write(path, data)
        written.set()
        assert go.wait(30)

    monkeypatch.setattr(ds_mod, "write_private", paused_write)
    out: dict = {}

    def upload():
        out["id"] = uploader.create_dataset(kid, "tiny", body["input_ids"], body["labels"], 2,
                                            {"mechanism": "none"}, None)

    def reconcile():
        other = open_store(tmp_path)
        try:
            out["reconciled"] = other.reconcile_dataset_files()
        finally:
            other.close()

    threads = [threading.Thread(target=upload)]
    threads[0].start()
    assert written.wait(30)
    threads.append(threading.Thread(target=reconcile))
    threads[1].start()
    threads[1].join(1.0)
    assert threads[1].is_alive()  # waiting for the upload's transaction
    go.set()
    for t in threads:
        t.join(60)
    try:
        assert out["reconciled"]["erased"] == [] and "id" in out
        assert uploader.dataset_data(out["id"])["input_ids"] == body["input_ids"]
    finally:
        uploader.close()
