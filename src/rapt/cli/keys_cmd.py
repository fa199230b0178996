"""`rapt serve keys`: add, list, revoke and purge the service's API keys (stored hashed)."""

from __future__ import annotations

from pathlib import Path

import typer

from rapt.cli._app import fail, sub_app
from rapt.cli.serve_cmd import DB_HELP, STORE_HELP, serve_app, store_target

keys_app = sub_app(help="API keys of the service (stored hashed).", no_args_is_help=True)
serve_app.add_typer(keys_app, name="keys")


def _open_store(db: Path | None, ctx: typer.Context | None, store: str | None = None):
    from rapt.service.store import Store

    target, files = store_target(db, ctx, store)
    try:
        return Store(target, files=files)
    except ValueError as e:
        fail(str(e))


@keys_app.command("add")
def keys_add(ctx: typer.Context,
             name: str = typer.Argument(..., help="a label for the key's owner"),
             admin: bool = typer.Option(False, "--admin", help="an operator key: may also read "
                                        "/v1/stats (counters over all tenants)"),
             db: Path | None = typer.Option(None, help=DB_HELP),
             store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Create an API key and print it once (only its SHA-256 hash is stored)."""
    from rapt.service import auth

    st = _open_store(db, ctx, store)
    try:
        st.check_key_name(name)
    except ValueError as e:
        st.close()
        fail(f"NAME {name[:40]!r}{'...' if len(name) > 40 else ''}: {e}")
    key = auth.new_key()
    kid = st.add_key(name, auth.hash_key(key), admin=admin)
    st.close()
    typer.echo(f"created {'admin ' if admin else ''}key {kid} for '{name}' in {st.describe()}; "
               "it is shown only this once:", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list(ctx: typer.Context, db: Path | None = typer.Option(None, help=DB_HELP),
              store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """List key ids, names, creation dates, admin and revoked marks (never the keys)."""
    import datetime

    def when(t: float) -> str:
        return datetime.datetime.fromtimestamp(t).isoformat(" ", "seconds")

    store = _open_store(db, ctx, store)
    for k in store.list_keys():
        marks = (["admin"] if k["admin"] else []) + (
            [f"revoked {when(k['revoked'])}"] if k["revoked"] else [])
        typer.echo("\t".join([k["id"], k["name"], when(k["created"]), *marks]))
    store.close()


def _on_key(ctx: typer.Context, db: Path | None, store_url: str | None, action: str,
            key: str) -> dict:
    """Run the store's ``action`` (``revoke_key`` / ``purge_key``) on ``key``; an unknown key
    or a bad state is the user's error (exit 2), and the store is closed either way."""
    store = _open_store(db, ctx, store_url)
    try:
        return getattr(store, action)(key)
    except (LookupError, ValueError) as e:
        fail(str(e))
    finally:
        store.close()


@keys_app.command("revoke")
def keys_revoke(ctx: typer.Context,
                key: str = typer.Argument(..., help="key id (from `keys list`) or name"),
                db: Path | None = typer.Option(None, help=DB_HELP),
                store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Revoke a key: the service refuses it from the next request on, its queued jobs are
    cancelled, its running ones stop at their next step (no prompt), its split sessions are
    deleted. Its datasets and prompts stay until `keys purge`."""
    row = _on_key(ctx, db, store, "revoke_key", key)
    typer.echo(f"revoked key {row['id']} ('{row['name']}'): {len(row['cancelled'])} queued "
               f"job(s) cancelled, {len(row['stopping'])} running job(s) stopping, "
               f"{row['sessions']} split session(s) deleted", err=True)


@keys_app.command("purge")
def keys_purge(ctx: typer.Context,
               key: str = typer.Argument(..., help="key id (from `keys list`) or name"),
               yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
               db: Path | None = typer.Option(None, help=DB_HELP),
               store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Revoke a key and delete everything it owns: datasets, jobs, prompts, split sessions
    and their files. The key's row stays, revoked. Cannot be undone."""
    if not yes:
        typer.confirm(f"delete everything key '{key}' owns?", abort=True)
    row = _on_key(ctx, db, store, "purge_key", key)
    typer.echo(f"purged key {row['id']} ('{row['name']}'): {row['datasets']} dataset(s), "
               f"{row['jobs']} job(s), {row['prompts']} prompt(s), {row['sessions']} split "
               "session(s) deleted", err=True)
