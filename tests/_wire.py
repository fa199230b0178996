"""The user's side on the wire, shared by the tests that watch it: small separable rows and
the CLI against the in-process service with every request recorded."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

from _service import folder_service
from fastapi.testclient import TestClient

from rapt.service import create_app

POS = "good great fun funny brilliant best love nice fine".split()
NEG = "bad awful boring dull terrible worst hate poor weak".split()
NEUTRAL = "the movie film plot story actor scene music was really very".split()


def rows(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        y = i % 2
        words = rng.sample(POS if y else NEG, 2) + rng.sample(NEUTRAL, 4)
        rng.shuffle(words)
        out.append((" ".join(words), y))
    return out


def write(path, data) -> str:
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in data))
    return str(path)


@contextlib.contextmanager
def recorded_wire(tmp_path, monkeypatch) -> Iterator[tuple]:
    """The CLI against the in-process service, every request recorded as (method, path,
    body); privatization noise seeded so that two runs send the same bytes. Yields (sent, key,
    backbone folder, backbone, seen)."""
    import rapt.client.client as client_module
    from rapt.http import HttpSession

    bb, folder, cfg, key = folder_service(tmp_path, monkeypatch)
    init = client_module.RaptClient.__init__

    def seeded(self, *args, **kw):
        init(self, *args, **{**kw, "seed": 0})

    monkeypatch.setattr(client_module.RaptClient, "__init__", seeded)
    with TestClient(create_app(cfg, backbones={str(folder): bb})) as tc:
        sent: list[tuple[str, str, bytes]] = []
        seen: list[str] = []  # every request's full URL and headers, for the leak checks
        tc.event_hooks["request"] = [
            lambda req: sent.append((req.method, req.url.path, req.read())),
            lambda req: seen.append(f"{req.url} {dict(req.headers)}")]
        monkeypatch.setattr(client_module, "HttpSession",
                            lambda url, k, timeout=120.0, client=None:
                            HttpSession(url, k, client=tc))
        yield sent, key, folder, bb, seen
