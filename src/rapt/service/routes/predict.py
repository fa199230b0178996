"""Inference with a tuned prompt, through the backbone's micro-batcher."""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout

import torch
from fastapi import APIRouter, Depends

from rapt.service.channels import denoise_rows
from rapt.service.deps import Owner, Svc, owned, owner
from rapt.service.errors import ServiceError, errors
from rapt.service.inference import InferenceQueueFullError, prompt_positions
from rapt.service.schemas import PredictRequest, PredictResponse

# On the router, so a route added here cannot forget the key check.
router = APIRouter(prefix="/v1", dependencies=[Depends(owner)],
                   responses=errors(401, 429))


@router.post("/predict", response_model=PredictResponse,
             responses=errors(404, 409, 422, 429, 503))
def predict(body: PredictRequest, svc: Svc, me: Owner) -> PredictResponse:
    row = owned(svc, "prompt", body.prompt_id, me)
    svc.require_backbone("prompt", row)
    channel = svc.recorded_channel("prompt", row, row.get("channel"))
    prompt = svc.prompt(row)
    ids = svc.rows_of(row["backbone"], body.input_ids, body.texts,
                      svc.limits.max_predict_rows, "max_predict_rows",
                      prompt_tokens=prompt_positions(prompt), text_pairs=body.text_pairs)
    svc.count_privatized("predict", row["backbone"], ids, row.get("privacy"))
    bb = svc.backbones[row["backbone"]]
    if channel is not None:  # read back as the training rows were; tokenized texts hold no k
        plain = row["plain_ids"] if body.input_ids is not None else None
        ids = denoise_rows(channel, bb, ids, plain)
    reader = channel.model.reader(bb) if channel is not None else bb
    if reader is bb:
        probs = _batched(svc, row, prompt, ids)
    else:
        # The prompt was tuned on the channel model's reader (an adapted copy): it predicts
        # there, not on the shared backbone the micro-batcher serves.
        probs = prompt.predict_proba(reader, ids)
    probs = probs.float().cpu()
    return PredictResponse(prompt_id=row["id"], labels=probs.argmax(-1).tolist(),
                           probabilities=probs.tolist(),
                           channel=channel.info if channel is not None else None,
                           pooled=_pooled(prompt, reader, ids) if body.return_pooled else None)


def _pooled(prompt, reader, ids) -> list[list[float]]:
    """The prompt's pooled states of ``ids`` (N, h), for the owner's output denoiser: the
    provider's own computation on the privatized rows it was sent, as the probabilities are."""
    if not hasattr(prompt, "pooled"):
        raise ServiceError(422, "no_pooled_state", "this prompt gives no pooled states")
    try:
        with torch.inference_mode():
            return prompt.pooled(reader, ids).float().cpu().tolist()
    except ValueError as e:  # a head that reads no pooled state (a causal LM's verbalizer)
        raise ServiceError(422, "no_pooled_state", f"{e}: return_pooled needs an encoder "
                           "head (linear or label-description)") from e


def _batched(svc, row: dict, prompt, ids) -> torch.Tensor:
    """Class probabilities (N, C) through the backbone's micro-batcher."""
    try:
        fut = svc.batchers[row["backbone"]].submit(prompt, ids)
    except InferenceQueueFullError as e:
        raise ServiceError(429, "queue_full", str(e)) from e
    try:
        return fut.result(timeout=300)
    except FutureTimeout as e:
        raise ServiceError(503, "timeout", "inference took longer than 300 s") from e
    except Exception:
        svc.forget_prompt(row["id"])  # a prompt that failed is loaded afresh next time
        raise
