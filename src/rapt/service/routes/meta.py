"""What the server is: health and loaded backbones (no API key needed)."""

from __future__ import annotations

from fastapi import APIRouter

from rapt import __version__
from rapt.service.deps import Svc
from rapt.service.schemas import BackboneInfo

router = APIRouter(prefix="/v1")


@router.get("/health")
def health(svc: Svc) -> dict:
    return {"status": "ok", "version": __version__, "backbones": list(svc.backbones)}


@router.get("/backbones", response_model=list[BackboneInfo])
def list_backbones(svc: Svc) -> list[BackboneInfo]:
    return [BackboneInfo(name=n, kind=bb.kind, vocab_size=int(bb.embeddings.shape[0]),
                         hidden_size=bb.hidden_size, special_ids=bb.special_ids,
                         channel=svc.channel_info(n))
            for n, bb in svc.backbones.items()]
