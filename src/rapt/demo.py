"""The main job behind ``rapt demo``: RAPT end to end on a small SST-2 subset.

1. The user side tokenizes sentences, prepends the plain tokens k (for the RAPT row) and
   privatizes everything with the dχ-privacy mechanism at η (calibrated to a target
   replacement probability P unless η is given).
2. The provider side tunes three prompts: on clean text (no privacy), on privatized text
   (+privatization), and on privatized text with privatized token reconstruction
   (+reconstruction); the reconstruction head is dropped afterwards.
3. Inference privatizes each test query the same way (same η) before prediction.
4. The embedding inversion attack scores what the provider could recover from the tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

DEFAULT_LR = {"prompt": 2e-2, "prefix": 1e-2, "lora": 1e-3, "full": 3e-5}


@dataclass
class DemoConfig:
    """Defaults finish in a few minutes on 2 CPU cores; raise sizes/epochs to scale up."""

    backbone: str = "minilm"
    dataset: str = "sst2-sentences"
    train_size: int = 512
    test_size: int = 200
    max_length: int = 48
    method: str = "prefix"
    num_virtual_tokens: int = 10
    lr: float | None = None  # None: DEFAULT_LR[method]
    epochs: int = 2
    batch_size: int = 32
    plain_len: int = 16
    plain_sequences: int = 1  # > 1: each training row gets one of that many plain sequences
    target_p: float = 0.3
    eta: float | None = None  # overrides target_p
    rec_weight: float = 1.0
    seed: int = 0  # data subset, init, plain tokens: not privacy noise
    noise_seed: int | None = None  # privacy noise: OS entropy unless set (then "seeded")
    privatizer_mode: str = "fast"


@dataclass
class DemoResult:
    config: dict
    eta: float
    p: float
    inversion_privacy: float
    seeded: bool = False
    rows: list[dict] = field(default_factory=list)  # one per setting
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def plain_tokens_for(tokenizer, m: int, sequences: int, n_rows: int, seed: int):
    """(plain_ids, plain_index): one sequence for all rows, or ``sequences`` of them assigned
    to the rows uniformly at random (seeded). Test rows use sequence 0."""
    from rapt.reconstruction import sample_plain_tokens

    if sequences <= 1:
        return sample_plain_tokens(tokenizer, m, seed=seed), None
    seqs = sample_plain_tokens(tokenizer, m, seed=seed, num_sequences=sequences)
    g = torch.Generator().manual_seed(seed + 17)
    return seqs, torch.randint(sequences, (n_rows,), generator=g).tolist()


def _accuracy(pred: list[int], gold: list[int]) -> float:
    return float(sum(int(a == b) for a, b in zip(pred, gold, strict=True))) / max(1, len(gold))


def run_demo(config: DemoConfig, log: Callable[[str], None] = print,
             progress: Callable[[str, dict], None] | None = None,
             backbone: Any = None) -> DemoResult:
    """Run the demo; ``progress(setting, step_record)`` is called after each training step."""
    from rapt.attacks.inversion import inversion_attack
    from rapt.data import load_dataset
    from rapt.models import load_backbone
    from rapt.privatization import (
        Privatizer,
        calibrate_eta_public,
        candidate_ids_from_tokenizer,
        replacement_probability,
    )
    from rapt.reconstruction import build_rows, privatize_rows
    from rapt.trainer import TuneConfig, tune

    t0 = time.perf_counter()
    bb = backbone if backbone is not None else load_backbone(config.backbone)
    tok = bb.tokenizer
    train = load_dataset(config.dataset, "train")
    test = load_dataset(config.dataset, "dev" if config.dataset.startswith("sst2") else "test")
    train = train.subset(min(config.train_size, len(train)), seed=config.seed)
    test = test.subset(min(config.test_size, len(test)), seed=config.seed)
    log(f"data: {len(train)} training / {len(test)} test examples of {config.dataset}")

    special = bb.special_ids
    cand = candidate_ids_from_tokenizer(tok, bb.embeddings.shape[0])
    clean_rows = build_rows(tok, train.texts, config.max_length)
    clean_test = build_rows(tok, test.texts, config.max_length)
    eta = config.eta
    if eta is None:
        eta = calibrate_eta_public(bb, config.target_p, candidate_ids=cand,
                                   mode=config.privatizer_mode)
        log(f"η = {eta:.3g} (calibrated for P ≈ {config.target_p} on the public text sample)")
    privatizer = Privatizer(bb.embeddings, eta, special_ids=special, candidate_ids=cand,
                            mode=config.privatizer_mode, seed=config.noise_seed)
    plain, plain_index = plain_tokens_for(tok, config.plain_len, config.plain_sequences,
                                          len(train), config.seed)
    rapt_rows = build_rows(tok, train.texts, config.max_length, plain, plain_index)
    rapt_test = build_rows(tok, test.texts, config.max_length, plain,
                           [0] * len(test) if plain_index is not None else None)

    priv_rows = privatize_rows(clean_rows, privatizer)
    priv_test = privatize_rows(clean_test, privatizer)
    priv_rapt = privatize_rows(rapt_rows, privatizer)
    priv_rapt_test = privatize_rows(rapt_test, privatizer)
    p = replacement_probability(clean_rows, priv_rows, special)
    flat_o = torch.tensor([t for r in clean_test for t in r])
    flat_p = torch.tensor([t for r in priv_test for t in r])
    inv = inversion_attack(flat_o, bb.embeddings, private_ids=flat_p, special_ids=special,
                           candidate_ids=cand, mode=config.privatizer_mode)
    log(f"privatized with η = {eta:.3g}: P = {p:.3f}, inversion empirical privacy = "
        f"{inv.empirical_privacy:.3f}")

    lr = config.lr if config.lr is not None else DEFAULT_LR.get(config.method, 1e-2)
    base = dict(method=config.method, num_virtual_tokens=config.num_virtual_tokens, lr=lr,
                epochs=config.epochs, batch_size=config.batch_size,
                max_length=config.max_length, seed=config.seed, rec_weight=config.rec_weight)
    settings = [
        ("no privacy", clean_rows, clean_test, False),
        ("+privatization", priv_rows, priv_test, False),
        ("+reconstruction", priv_rapt, priv_rapt_test, True),
    ]
    result = DemoResult(config=asdict(config), eta=float(eta), p=float(p),
                        inversion_privacy=float(inv.empirical_privacy),
                        seeded=privatizer.seeded)
    for name, rows, test_rows, rec in settings:
        t = time.perf_counter()
        cfg = TuneConfig(**base, reconstruction=rec)
        cb = (lambda r, name=name: progress(name, r)) if progress is not None else None
        tuned = tune(bb, rows, train.labels, len(train.label_names), cfg,
                     plain_ids=plain if rec else None,
                     plain_index=plain_index if rec else None, progress=cb)
        acc = _accuracy(tuned.predict(bb, test_rows), test.labels)
        hist = tuned.meta["history"]
        row = {"setting": name, "accuracy": acc, "train_seconds": time.perf_counter() - t,
               "steps": tuned.meta["steps"], "loss_curve": [h["loss"] for h in hist]}
        if rec:
            tail = hist[-max(1, len(hist) // 5):]
            row["rec_acc_end"] = sum(h.get("rec_acc", 0.0) for h in tail) / len(tail)
        result.rows.append(row)
        log(f"{name:16s} accuracy {acc:.3f}  ({row['train_seconds']:.0f} s)")
    result.seconds = time.perf_counter() - t0
    return result


def format_table(result: DemoResult) -> str:
    """A small Markdown table of the demo's numbers."""
    lines = ["| setting | accuracy | P | inversion empirical privacy |", "|---|---|---|---|"]
    for r in result.rows:
        private = r["setting"] != "no privacy"
        lines.append(f"| {r['setting']} | {r['accuracy']:.3f} | "
                     f"{result.p:.3f} | {result.inversion_privacy:.3f} |" if private else
                     f"| {r['setting']} | {r['accuracy']:.3f} | 0 | 0 |")
    c = result.config
    lines.append("")
    lines.append(f"{c['method']} tuning of {c['backbone']} on {c['train_size']} {c['dataset']} "
                 f"sentences, {c['epochs']} epochs, η = {result.eta:.3g}, "
                 f"{c['plain_len']} plain tokens; {result.seconds:.0f} s in all.")
    return "\n".join(lines)


def make_plot(result: DemoResult):
    """Accuracy bars and training-loss curves -> matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    names = [r["setting"] for r in result.rows]
    accs = [r["accuracy"] for r in result.rows]
    bars = ax1.bar(names, accs, color=["#999999", "#d62728", "#2ca02c"][:len(names)])
    for b, a in zip(bars, accs, strict=True):
        ax1.text(b.get_x() + b.get_width() / 2, a + 0.01, f"{a:.2f}", ha="center")
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("test accuracy (privatized queries)")
    ax1.set_title(f"η = {result.eta:.3g}, P = {result.p:.2f}, "
                  f"inversion privacy = {result.inversion_privacy:.2f}")
    for r in result.rows:
        ax2.plot(r["loss_curve"], label=r["setting"])
    ax2.set_xlabel("step")
    ax2.set_ylabel("training loss (task [+ reconstruction])")
    ax2.legend()
    fig.tight_layout()
    return fig
