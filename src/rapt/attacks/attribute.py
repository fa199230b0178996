"""Attribute inference attack (RAPT App. A.3.1, after Plant et al. 2021).

The attacker sees representations of a user's text and trains a 2-layer MLP (768 hidden units,
ReLU) on the mean-pooled vectors (eq. 11) to predict a private attribute (TrustPilot gender or
age). Two feature sources, as in the paper: the (privatized) input word embeddings M(x), and the
tuned model's last-layer states H. Empirical privacy = 1 − attack accuracy on held-out users;
it only means something next to the majority-class rate (an attacker that always guesses the
majority class scores that much without looking at the text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from rapt.models import Backbone


@dataclass
class AttributeResult:
    """Attack outcome on ``n_test`` held-out examples."""

    attribute: str
    feature: str
    accuracy: float
    empirical_privacy: float
    majority_rate: float
    n_train: int
    n_test: int
    balanced_accuracy: float = float("nan")  # mean per-class recall: 1 / classes = blind

    def as_dict(self) -> dict:
        return asdict(self)


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    from rapt.tuning.tune import pad_batch

    return pad_batch(rows, pad_id)


@torch.no_grad()
def embedding_features(backbone: Backbone, rows: Sequence[Sequence[int]],
                       batch_size: int = 256) -> Tensor:
    """Mean of the input embeddings of each row's non-special tokens -> (N, d)."""
    emb = backbone.embeddings.detach().float().cpu()
    special = torch.tensor(backbone.special_ids, dtype=torch.long)
    out = []
    for s in range(0, len(rows), batch_size):
        ids, mask = _pad(rows[s:s + batch_size], backbone.tokenizer.pad_token_id)
        mask = mask.bool() & ~torch.isin(ids, special)
        m = mask.float().unsqueeze(-1)
        out.append((emb[ids] * m).sum(1) / m.sum(1).clamp_min(1.0))
    return torch.cat(out)


@torch.no_grad()
def hidden_features(backbone: Backbone, rows: Sequence[Sequence[int]], tuned=None,
                    batch_size: int = 64) -> Tensor:
    """Mean-pooled last-layer states -> (N, h): of the tuned model (a ``TunedPrompt``; plain
    token positions excluded, as its task head sees them) or of the bare backbone."""
    from rapt.tuning.tune import pad_batch

    dev = next(iter(backbone.model.parameters())).device
    out = []
    model = tuned.build(backbone) if tuned is not None else None
    off = int(tuned.meta.get("plain_offset", 0)) if tuned is not None else 0
    m = int(tuned.meta.get("plain_len", 0)) if tuned is not None else 0
    for s in range(0, len(rows), batch_size):
        ids, mask = pad_batch(rows[s:s + batch_size], backbone.tokenizer.pad_token_id, dev)
        if model is not None:
            _, _, hidden = model(ids, mask, with_rec=False)
        else:
            from rapt.tuning.tuners import base_model

            hidden = base_model(backbone.model)(input_ids=ids, attention_mask=mask,
                                                use_cache=False).last_hidden_state
        keep = mask.clone()
        if m:
            keep[:, off:off + m] = 0
        w = keep.float().unsqueeze(-1)
        out.append(((hidden.float() * w).sum(1) / w.sum(1).clamp_min(1.0)).cpu())
    return torch.cat(out)


def attribute_attack(train_x: Tensor, train_y: Sequence[int], test_x: Tensor,
                     test_y: Sequence[int], *, attribute: str = "attribute",
                     feature: str = "features", hidden: int = 768, epochs: int = 60,
                     lr: float = 1e-3, batch_size: int = 64, weight_decay: float = 1e-4,
                     seed: int = 0) -> AttributeResult:
    """Train the 2-layer MLP attacker on (train_x, train_y) and score it on the test split.

    Features are standardised with the training split's mean/std (the attacker may do that)."""
    ytr = torch.as_tensor(list(train_y), dtype=torch.long)
    yte = torch.as_tensor(list(test_y), dtype=torch.long)
    if len(ytr) != len(train_x) or len(yte) != len(test_x):
        raise ValueError("features and labels differ in length")
    if len(ytr) == 0 or len(yte) == 0:
        raise ValueError("attribute attack needs non-empty train and test splits")
    n_classes = int(max(ytr.max(), yte.max())) + 1
    mu, sd = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    xtr, xte = (train_x.float() - mu) / sd, (test_x.float() - mu) / sd
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mlp = nn.Sequential(nn.Linear(xtr.shape[1], hidden), nn.ReLU(),
                            nn.Linear(hidden, n_classes))
    opt = torch.optim.Adam(mlp.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        for idx in torch.randperm(len(xtr), generator=g).split(batch_size):
            loss = nn.functional.cross_entropy(mlp(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = mlp(xte).argmax(-1)
        acc = float((pred == yte).float().mean())
        # Accuracy alone rewards always answering the majority class on skewed attributes.
        balanced = float(torch.stack([(pred[yte == c] == c).float().mean()
                                      for c in yte.unique()]).mean())
    # The rate of a blind attacker that always answers the training split's majority class.
    majority = float((yte == torch.bincount(ytr, minlength=n_classes).argmax()).float().mean())
    return AttributeResult(attribute, feature, acc, 1.0 - acc, majority, len(ytr), len(yte),
                           balanced)
