"""The largest ε rapt calls differentially private, and the help texts that state it.

A module of its own, importing nothing: rapt.dp validates with it and rapt.config's users (the
CLI, the service's schemas) print it, and rapt.config, which needs no torch, imports rapt.dp
only lazily, so neither can hold it for the other.
"""

from __future__ import annotations

# A target ε above it, or a noise multiplier whose ε over the planned steps is above it, is
# refused. (ε, δ)-DP bounds any membership test by TPR ≤ e^ε·FPR + δ: at ε = 100,
# e^-ε = 3.7e-44, so a test that errs on one non-member in 1e43 may find every member, i.e. the
# bound promises nothing. Published deployments use ε from below 1 to a few tens (the 2020 US
# Census: 19.61 in all), all well below the line.
EPSILON_MAX = 100.0

# Help texts of the DP options, shared by `rapt tune` and `rapt client tune`.
DP_EPSILON_HELP = (f"PromptDPSGD target ε, at most ε_max = {EPSILON_MAX:g} (above it a DP "
                   "guarantee promises nothing: docs/THREAT_MODEL.md)")
DP_NOISE_HELP = (f"PromptDPSGD noise multiplier σ; refused when its ε over the planned steps "
                 f"is above ε_max = {EPSILON_MAX:g} (the error names the smallest σ accepted)")
