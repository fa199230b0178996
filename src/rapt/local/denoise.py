"""User-side output denoising, after Split-N-Denoise (Mai et al. 2023, arXiv 2310.09130).

The provider's tuned model reads the privatized query and returns its pooled state z̃ (what the
task head reads). The user knows what the provider does not: the clean tokens and which of them
were replaced, and by what. A small network on the user's machine reads z̃ with that knowledge,
as static token embeddings from the table the user already holds to privatize (no backbone pass),
and corrects z̃ towards the state the clean query would have given; the task head then reads the
corrected state.

Training needs no private text: the provider runs its tuned model on *public* sentences, clean and
privatized, and fits the network to map (z̃, token features) to z_clean (:func:`fit_denoiser`);
it ships the network with the prompt, like a channel model. The user only runs it: one small
MLP per query (:data:`WIDTH` wide, about 0.5M parameters at h = 384).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

WIDTH = 256


def token_features(embeddings: Tensor, clean: Sequence[Sequence[int]],
                   released: Sequence[Sequence[int]], special_ids: Sequence[int]) -> Tensor:
    """(N, 3h + 1) float32 per row: the mean static embedding of the clean tokens, of the
    released ones, of the clean tokens that were replaced (0 when none was), and the fraction
    replaced; over the non-special positions. ``clean`` and ``released`` rows align one to one
    (the mechanism replaces tokens in place)."""
    special = {int(i) for i in special_ids}
    emb = embeddings.detach().float().cpu()
    h = emb.shape[1]
    out = torch.zeros(len(clean), 3 * h + 1)
    for i, (c, r) in enumerate(zip(clean, released, strict=True)):
        if len(c) != len(r):
            raise ValueError(f"row {i}: clean and released rows differ in length "
                             f"({len(c)} vs {len(r)})")
        keep = [j for j, t in enumerate(c) if int(t) not in special]
        if not keep:
            continue
        ci = torch.tensor([int(c[j]) for j in keep])
        ri = torch.tensor([int(r[j]) for j in keep])
        changed = ci != ri
        out[i, :h] = emb[ci].mean(0)
        out[i, h:2 * h] = emb[ri].mean(0)
        if changed.any():
            out[i, 2 * h:3 * h] = emb[ci[changed]].mean(0)
        out[i, -1] = changed.float().mean()
    return out


class OutputDenoiser(nn.Module):
    """ẑ = z̃ + MLP([z̃, token features]); the last layer starts at 0, so an untrained denoiser
    is the identity (it cannot make a prompt worse before it has learned anything)."""

    def __init__(self, hidden: int, width: int = WIDTH) -> None:
        super().__init__()
        self.hidden = hidden
        self.net = nn.Sequential(nn.Linear(4 * hidden + 1, width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU(), nn.Linear(width, hidden))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.register_buffer("scale", torch.ones(4 * hidden + 1))

    def forward(self, pooled: Tensor, features: Tensor) -> Tensor:
        """(B, h) pooled state of the privatized query, (B, 3h + 1) token features -> (B, h)."""
        x = torch.cat([pooled, features], -1) / self.scale
        return pooled + self.net(x)

    @torch.no_grad()
    def correct(self, pooled: Tensor, embeddings: Tensor, clean: Sequence[Sequence[int]],
                released: Sequence[Sequence[int]], special_ids: Sequence[int]) -> Tensor:
        """The user's side in one call: (N, h) pooled states the provider returned for the
        ``released`` rows -> the corrected states, from the :func:`token_features` of
        (``clean``, ``released``) on the user's embedding table; on ``pooled``'s device."""
        feats = token_features(embeddings, clean, released, special_ids)
        return self.to(pooled.device).eval()(pooled, feats.to(pooled.device))


@dataclass(frozen=True)
class DenoiserFit:
    """What :func:`fit_denoiser` measured: mean squared distance to the clean state before and
    after denoising on a held-out tenth of the public pairs, per epoch."""

    before: float
    after: list[float]


def fit_denoiser(pooled_private: Tensor, features: Tensor, pooled_clean: Tensor, *,
                 epochs: int = 60, lr: float = 1e-3, batch_size: int = 256, seed: int = 0,
                 weight_decay: float = 1e-4, device: str | torch.device = "cpu",
                 progress: Callable[[int], None] | None = None
                 ) -> tuple[OutputDenoiser, DenoiserFit]:
    """Fit an :class:`OutputDenoiser` on public pairs: (N, h) states of privatized sentences,
    their (N, 3h + 1) token features, (N, h) states of the same sentences clean. Keeps the
    epoch with the lowest held-out error (a tenth of the pairs, seeded). ``progress(1)`` after
    each epoch."""
    g = torch.Generator().manual_seed(seed)
    n = len(pooled_private)
    perm = torch.randperm(n, generator=g)
    val, tr = perm[: max(1, n // 10)], perm[max(1, n // 10):]
    torch.manual_seed(seed)
    model = OutputDenoiser(pooled_private.shape[1]).to(device)
    x = torch.cat([pooled_private, features], -1)
    model.scale.copy_(x[tr].std(0).clamp_min(1e-6).to(device))
    zp, f, zc = (t.float().to(device) for t in (pooled_private, features, pooled_clean))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def err(idx: Tensor) -> float:
        with torch.no_grad():
            return float(((model(zp[idx], f[idx]) - zc[idx]) ** 2).sum(-1).mean())

    before = float(((zp[val] - zc[val]) ** 2).sum(-1).mean())
    best, best_state, curve = err(val), {k: v.clone() for k, v in model.state_dict().items()}, []
    for _ in range(epochs):
        model.train()
        order = tr[torch.randperm(len(tr), generator=g)]
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            loss = ((model(zp[idx], f[idx]) - zc[idx]) ** 2).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        curve.append(err(val))
        if progress is not None:
            progress(1)
        if curve[-1] < best:
            best, best_state = curve[-1], {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return model.cpu().eval(), DenoiserFit(before, curve)
