"""Label differential privacy by randomized response (Warner 1965; the RR baseline of Ghazi et
al., "Deep Learning with Label Differential Privacy", NeurIPS 2021).

Each label y ∈ {0..C−1} is kept with probability p = e^ε / (e^ε + C − 1) and otherwise replaced
by one of the other C − 1 classes, uniformly. For any two labels y, y' and any output z,
P[RR(y) = z] ≤ e^ε · P[RR(y') = z]: the randomized label is ε-DP with respect to the true one.
Whatever is computed from the randomized labels alone is post-processing, so drawing them
*once* and training on them for any number of epochs keeps every row's label ε-label-DP against
whoever sees the training transcript (in SAP: the provider, through ∂l/∂g). The inputs are not
covered (label DP protects labels only), and neither is anything computed from the true labels
(CTI's contributing tokens are; SplitConfig refuses the two together).

The cost: a fraction 1 − p of the training labels is wrong (C = 3: p = 0.58 at ε = 1, 0.79 at
ε = 2, 0.91 at ε = 3). Randomness comes from :class:`rapt.noise.NoiseSource`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rapt.noise import NoiseSource

__all__ = ["keep_probability", "randomized_response"]


def keep_probability(epsilon: float, num_classes: int) -> float:
    """P[RR(y) = y] = e^ε / (e^ε + C − 1)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"label-DP ε must be a positive finite number, got {epsilon!r}")
    if num_classes < 2:
        raise ValueError(f"randomized response needs >= 2 classes, got {num_classes}")
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def randomized_response(labels: Tensor, num_classes: int, epsilon: float,
                        noise: NoiseSource | None = None) -> Tensor:
    """ε-label-DP copy of ``labels`` (n,) in 0..C−1 (int64, (n,)); ``noise`` defaults to OS
    entropy."""
    y = torch.as_tensor(labels).long().flatten()
    p = keep_probability(epsilon, num_classes)
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}")
    noise = noise if noise is not None else NoiseSource()
    keep = noise.uniform(y.numel()) < p
    # another class, uniform over the C − 1 others: y + 1 + floor(u·(C − 1)) mod C (u < 1)
    shift = 1 + (noise.uniform(y.numel()) * (num_classes - 1)).floor().long()
    return torch.where(keep, y, (y + shift) % num_classes)
