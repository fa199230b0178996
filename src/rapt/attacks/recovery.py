"""Token reconstruction attacks on a text-to-text privatized release, and how they are scored.

The interface every reconstruction attacker implements::

    Attacker = Callable[[ReconstructionInput], list[list[int]]]

An attacker receives a :class:`ReconstructionInput` -- the privatized rows plus what the
provider knows anyway (the backbone's embeddings, the candidate vocabulary, the special ids,
η, public text, the backbone itself) -- and returns one guessed original id per position, row
for row, same lengths.  It never receives the original ids: scoring happens afterwards, in
:func:`token_recovery`, against rows the attacker never saw.

Registry: ``ATTACKERS`` maps a name to an attacker.  A module that defines one calls
:func:`register_attacker` at import; ``rapt.attacks/__init__`` imports this package's, so they
are registered whenever ``rapt.attacks`` is imported.  Registered here: ``"nn"`` (nearest
neighbour); in :mod:`rapt.attacks.bayes`: ``"bayes"``; the contextual denoiser registers
``"denoiser"`` when :mod:`rapt.channel.denoiser` is imported (as the commands that offer it do).
Attacker-specific settings travel in
``ReconstructionInput.options`` (e.g. ``{"bayes_k": 2000, "bayes_samples": 64}``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rapt.privacy.inversion import invert_ids
from rapt.privacy.nn_search import NNIndex

__all__ = ["ATTACKERS", "Attacker", "ReconstructionInput", "nearest_neighbour_attack",
           "reconstruct", "register_attacker", "run_attackers", "token_recovery"]


@dataclass
class ReconstructionInput:
    """What a reconstruction attacker sees: the release and public knowledge, never originals.

    ``private_rows``: the released token ids, one list per text; ``embeddings``: (V, d) the
    backbone's input embeddings (the mechanism's); ``eta``: the mechanism's η;
    ``special_ids``: ids the mechanism passes through; ``candidate_ids``: the mechanism's
    output vocabulary (None = all V); ``index``: a prebuilt search over the candidates
    (optional, speeds NN); ``public_rows``: tokenized public text (a prior / training data for
    attackers that learn the channel, e.g. from :class:`rapt.channel.corpus.ChannelCorpus`);
    ``backbone``: the loaded backbone (tokenizer, model) for attackers that need it;
    ``seed``: for attackers that sample (None = OS entropy); ``options``: per-attacker
    settings.
    """

    private_rows: list[list[int]]
    embeddings: Tensor
    eta: float
    special_ids: tuple[int, ...] = ()
    candidate_ids: Tensor | None = None
    index: NNIndex | None = None
    public_rows: list[list[int]] | None = None
    backbone: Any = None
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


Attacker = Callable[[ReconstructionInput], list[list[int]]]
ATTACKERS: dict[str, Attacker] = {}


def register_attacker(name: str, attacker: Attacker) -> Attacker:
    """Add ``attacker`` under ``name``; a name is registered once (re-registering the same
    callable, e.g. on a module reload, is allowed)."""
    old = ATTACKERS.get(name)
    if old is not None and getattr(old, "__qualname__", old) != getattr(
            attacker, "__qualname__", attacker):
        raise ValueError(f"attacker {name!r} is already registered")
    ATTACKERS[name] = attacker
    return attacker


def _split(flat: Tensor, rows: Sequence[Sequence[int]]) -> list[list[int]]:
    return [r.tolist() for r in torch.split(flat, [len(r) for r in rows])]


def _flat(rows: Sequence[Sequence[int]]) -> Tensor:
    return torch.tensor([int(i) for r in rows for i in r], dtype=torch.long)


def nearest_neighbour_attack(inp: ReconstructionInput) -> list[list[int]]:
    """Nearest-neighbour inversion of a token release (:func:`rapt.privacy.inversion.invert_ids`).

    With the mechanism's own embeddings and candidates every released token is its own
    nearest neighbour, so this returns the private ids: it recovers exactly the tokens the
    mechanism kept (recovery over all = 1 − P, over replaced = 0)."""
    flat = _flat(inp.private_rows)
    if flat.numel() == 0:
        return [[] for _ in inp.private_rows]
    guess = invert_ids(flat, inp.embeddings, candidate_ids=inp.candidate_ids, index=inp.index)
    return _split(guess, inp.private_rows)


register_attacker("nn", nearest_neighbour_attack)


def token_recovery(original: Sequence[Sequence[int]], private: Sequence[Sequence[int]],
                   guessed: Sequence[Sequence[int]], special_ids: Sequence[int] = ()) -> dict:
    """Share of tokens the attacker got right.

    ``all``: over every non-special position; ``replaced``: over the positions the mechanism
    changed (private != original) only; ``n_all`` / ``n_replaced``: the counts behind them (a
    rate over 0 positions is 0.0).  Rows must align position by position."""
    for name, rows in (("private", private), ("guessed", guessed)):
        if len(rows) != len(original) or any(
                len(a) != len(b) for a, b in zip(rows, original, strict=True)):
            raise ValueError(f"{name} rows do not align with the original rows")
    orig, priv, guess = _flat(original), _flat(private), _flat(guessed)
    keep = ~torch.isin(orig, torch.tensor(sorted({int(i) for i in special_ids}),
                                          dtype=torch.long))
    hit = (guess == orig) & keep
    repl = (priv != orig) & keep
    n_all, n_repl = int(keep.sum()), int(repl.sum())
    return {"all": float(hit.sum()) / n_all if n_all else 0.0,
            "replaced": float((hit & repl).sum()) / n_repl if n_repl else 0.0,
            "n_all": n_all, "n_replaced": n_repl}


def run_attackers(names: Sequence[str], inp: ReconstructionInput,
                  original: Sequence[Sequence[int]],
                  classes: Sequence[Sequence[int]] | None = None) -> dict[str, dict]:
    """Run each named attacker on ``inp`` and score it against ``original`` (which the
    attackers never see): name -> :func:`token_recovery` dict, with ``classes`` (each
    position's index into :data:`rapt.privacy.by_kind.CLASSES`) also its recovery per kind
    under ``by_kind`` (:func:`rapt.privacy.kind_recovery.recovery_by_class`)."""
    unknown = [n for n in names if n not in ATTACKERS]
    if unknown:
        raise ValueError(f"unknown attacker(s) {', '.join(unknown)}; registered: "
                         f"{', '.join(sorted(ATTACKERS))}")
    out = {}
    flat_classes = None if classes is None else [int(c) for r in classes for c in r]
    for name in names:
        guessed = ATTACKERS[name](inp)
        out[name] = token_recovery(original, inp.private_rows, guessed, inp.special_ids)
        if flat_classes is not None:
            from rapt.privacy.kind_recovery import recovery_by_class

            out[name]["by_kind"] = recovery_by_class(
                [int(t) for r in original for t in r], [int(t) for r in guessed for t in r],
                flat_classes, inp.special_ids)
    return out


def reconstruct(rows: Sequence[Sequence[int]], backbone: Any, eta: float, names: Sequence[str],
                *, public_rows: Sequence[Sequence[int]] | None = None, seed: int | None = None,
                mode: str = "fast", options: dict[str, Any] | None = None,
                classes: Sequence[Sequence[int]] | None = None) -> dict:
    """Privatize ``rows`` (token ids of the user's texts) at ``eta`` with the backbone's
    mechanism, run each named attacker on the release and score it (what
    ``rapt attack reconstruct`` prints).  ``seed`` seeds the mechanism (``seed``) and the
    attackers (``seed + 1``); None = OS entropy.  Returns {"eta", "p", "n_tokens",
    "attackers": name -> token_recovery dict}, per kind of token too with ``classes``
    (:func:`run_attackers`)."""
    from rapt.privacy.mechanism import (
        Privatizer,
        candidate_ids_from_tokenizer,
        replacement_probability,
    )
    from rapt.privacy.nn_search import build_index

    emb = backbone.embeddings.detach()
    cand = candidate_ids_from_tokenizer(backbone.tokenizer, emb.shape[0])
    index = build_index(emb[cand].float(), mode)  # type: ignore[arg-type]
    priv = Privatizer(emb, eta, special_ids=backbone.special_ids, candidate_ids=cand,
                      index=index, seed=seed)
    flat = _flat(rows)
    private = _split(priv.privatize_ids(flat).cpu(), rows) if flat.numel() else [[] for _ in rows]
    inp = ReconstructionInput(private, emb, float(eta), tuple(int(i) for i in backbone.special_ids),
                              cand, index, None if public_rows is None else
                              [list(r) for r in public_rows], backbone,
                              None if seed is None else seed + 1, dict(options or {}))
    return {"eta": float(eta), "p": replacement_probability(flat, _flat(private),
                                                            backbone.special_ids),
            "n_tokens": int(flat.numel()), "seeded": priv.seeded,
            "attackers": run_attackers(names, inp, rows, classes)}
