"""The channel adapter (issue 27, remedy b) on MiniLM at P ≈ 0.4: does the backbone read
privatized text more like clean text after distillation on public text?

Public text (``public_corpus_for(task)``; for SST-2: TREC, Financial PhraseBank, CB premises
and hypotheses, TrustPilot; for FP: SST-2, TREC, CB, TrustPilot) is privatized by the
provider at the η that ``calibrate_eta_public`` gives for P ≈ 0.4; a
:class:`rapt.channel.adapter.ChannelAdapter` (LoRA) is trained for a wall-clock budget on
``--threads`` threads so that MiniLM's last hidden states on the privatized rows match its own
on the clean rows. Reported, raw backbone against adapted:

* the distillation loss (and its parts) on held-out public pairs (fresh noise);
* on the task's dev split privatized with fresh noise: the same loss and the cosine
  similarity of the mean-pooled privatized vector with the clean one; the adapted backbone's
  drift on clean text;
* a linear probe (logistic regression on frozen mean-pooled features, ``--probe-n`` task train
  sentences, scored on dev): clean / privatized raw / privatized adapted.

Writes benchmarks/results/channel_adapter.{json,md} (``--quick``: channel_adapter_quick.*).

    python -m benchmarks.bench_channel_adapter [--budget-min 15] [--threads 1] [--save DIR]
        [--quick]

``--save DIR`` keeps the trained adapter (outside the repo, e.g.
/tmp/channel/adapter-minilm-p0.4-sst2) for benchmarks/bench_channel.py.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, replace

import torch

from benchmarks._common import RESULTS, command, machine, write_json, write_md
from benchmarks.bench_channel_denoiser import privatize, public_texts
from rapt.channel.adapter import (
    ChannelAdapterConfig,
    distillation_loss,
    train_channel_adapter,
)
from rapt.channel.corpus import encode_rows
from rapt.data import load_dataset
from rapt.models import load_backbone
from rapt.privacy.mechanism import (
    Privatizer,
    calibrate_eta_public,
    candidate_ids_from_tokenizer,
    replacement_probability,
    tokenize_texts,
)
from rapt.tuning.heads import pool
from rapt.tuning.tuners import base_model

HOLDOUT = 300  # public rows kept out of training, for the held-out distillation loss


def steps_for_budget(bb, cfg: ChannelAdapterConfig, clean, private,
                     budget_s: float) -> tuple[int, float]:
    """Optimizer steps that fit in ``budget_s``, from 4 timed steps on a throwaway adapter."""
    n = 4 * cfg.batch_size
    t0 = time.perf_counter()
    train_channel_adapter(bb, clean[:n], private[:n], replace(cfg, epochs=1))
    per_step = (time.perf_counter() - t0) / 4
    return max(1, int(budget_s / per_step)), per_step


@torch.no_grad()
def features(bb, rows, max_length: int, batch_size: int = 64) -> torch.Tensor:
    """Mean-pooled last hidden states (N, h) of ``[CLS] row [SEP]`` (MiniLM's sentence vector)."""
    body = base_model(bb.model)
    out = []
    for s in range(0, len(rows), batch_size):
        ids, mask, _ = encode_rows(bb.tokenizer, rows[s:s + batch_size], max_length)
        h = body(input_ids=ids, attention_mask=mask).last_hidden_state
        out.append(pool(h, mask, "mean").float())
    return torch.cat(out)


def probe_accuracy(x_train, y_train, x_test, y_test, l2: float = 1e-3) -> float:
    """Accuracy of an L2-regularized logistic regression (LBFGS) on standardized features."""
    mu, sd = x_train.mean(0), x_train.std(0).clamp(min=1e-6)
    xa, xb = (x_train - mu) / sd, (x_test - mu) / sd
    ya, yb = torch.tensor(y_train), torch.tensor(y_test)
    lin = torch.nn.Linear(xa.shape[1], int(ya.max()) + 1)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lin(xa), ya) + l2 * lin.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float((lin(xb).argmax(-1) == yb).float().mean())


def linear_probe(bb, adapted, priv_for, n_train: int, max_length: int,
                 task: str = "sst2") -> dict:
    """Probe accuracy on the task's dev split: clean features (raw backbone), privatized
    features read by the raw backbone and by the adapted one (train and dev privatized alike)."""
    room = max_length - 2
    train, dev = load_dataset(task, "train"), load_dataset(task, "dev")
    if len(train) > n_train:
        train = train.subset(n_train, seed=0)
    tr = [r[:room] for r in tokenize_texts(list(train.texts), bb.tokenizer)]
    dv = [r[:room] for r in tokenize_texts(list(dev.texts), bb.tokenizer)]
    tr_p, dv_p = priv_for(4, tr), priv_for(5, dv)
    y_tr, y_dv = list(train.labels), list(dev.labels)
    out = {"train_rows": len(tr), "dev_rows": len(dv)}
    for name, reader, a, b in (("clean", bb, tr, dv), ("privatized, raw backbone", bb, tr_p, dv_p),
                               ("privatized, adapted backbone", adapted, tr_p, dv_p)):
        out[name] = probe_accuracy(features(reader, a, max_length), y_tr,
                                   features(reader, b, max_length), y_dv)
    return out


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-min", type=float, default=15.0, help="wall minutes of training")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", default=None, help="folder to save the trained adapter in")
    ap.add_argument("--target-p", type=float, default=0.4)
    ap.add_argument("--per-source", type=int, default=3000)
    ap.add_argument("--task", default="sst2", choices=["sst2", "financial_phrasebank"],
                    help="evaluation task: the public corpus is disjoint from it; the probe and "
                         "the dev rows are its own")
    ap.add_argument("--probe-n", type=int, default=2000, help="task train rows of the probe")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--pooled-weight", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1,
                    help="fresh privatizations of each training sentence")
    ap.add_argument("--clean-share", type=float, default=0.2,
                    help="share of the training sentences added again as (clean, clean) pairs")
    ap.add_argument("--name", default=None, help="results file name (default channel_adapter)")
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script")
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared
    host = machine()
    t_start = time.perf_counter()

    bb = load_backbone("minilm")
    eta = calibrate_eta_public(bb, args.target_p)
    cand = candidate_ids_from_tokenizer(bb.tokenizer, bb.embeddings.shape[0])

    def priv_for(seed: int, rows):
        return privatize(Privatizer(bb.embeddings, eta, special_ids=bb.special_ids,
                                    candidate_ids=cand, mode="fast", seed=seed), rows)

    room = args.max_length - 2
    texts, prov = public_texts(60 if args.quick else args.per_source, seed=0, task=args.task)
    clean = [r[:room] for r in tokenize_texts(texts, bb.tokenizer) if r]
    hold = min(HOLDOUT, len(clean) // 5)
    clean, held_clean = clean[hold:], clean[:hold]
    priv, held_priv = priv_for(1, clean), priv_for(3, held_clean)

    cfg = ChannelAdapterConfig(lora_r=args.lora_r, lora_alpha=2 * args.lora_r, lr=args.lr,
                               batch_size=args.batch, max_length=args.max_length,
                               pooled_weight=args.pooled_weight, seed=0)
    budget = 20.0 if args.quick else args.budget_min * 60
    steps, per_step = steps_for_budget(bb, cfg, clean, priv, budget)
    rows = steps * cfg.batch_size
    # More steps than one pass: --repeats fresh privatizations of the same sentences (each
    # costs seconds), then extra epochs over them; the rows per pass are cut so that the
    # schedule ends (lr decayed to 0) at the budget. Epochs over one draw overfit that draw.
    share, reps = 1 + args.clean_share, args.repeats
    cfg = replace(cfg, epochs=max(1, -(-rows // int(len(clean) * share * reps))))
    n_rows = min(len(clean), int(rows / (cfg.epochs * share * reps)))
    # Identity pairs: the adapted backbone also reads clean text (label descriptions, plain
    # tokens), which the privatized pairs alone leave unconstrained.
    n_id = int(args.clean_share * n_rows)
    draws = [priv[:n_rows]] + [priv_for(1 + 100 * k, clean[:n_rows]) for k in range(1, reps)]
    pairs_c = clean[:n_rows] * reps + clean[:n_id]
    pairs_p = [r for d in draws for r in d] + clean[:n_id]
    deadline = time.perf_counter() + 1.2 * budget
    t0, c0 = time.perf_counter(), time.process_time()
    adapter = train_channel_adapter(
        bb, pairs_c, pairs_p, cfg,
        meta={"corpus": prov, "eta": eta, "target_p": args.target_p,
              "privatizer": {"mode": "fast", "seed": 1, "repeats": reps},
              "identity_rows": n_id},
        should_stop=lambda: time.perf_counter() > deadline)
    train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    if args.save:
        adapter.save(args.save)
    adapted = adapter.adapted_backbone(bb)

    kw = {"max_length": args.max_length, "pooled_weight": args.pooled_weight}
    dev = load_dataset(args.task, "dev")
    ev_clean = [r[:room] for r in tokenize_texts(list(dev.texts), bb.tokenizer)]
    ev_priv = priv_for(2, ev_clean)
    out = {"command": command(), "machine": host,
           "backbone": "minilm", "task": args.task, "eta": eta, "target_p": args.target_p,
           "P_train": replacement_probability(clean, priv, bb.special_ids),
           "P_eval": replacement_probability(ev_clean, ev_priv, bb.special_ids),
           "corpus": {"sources": prov, "rows_used": n_rows, "identity_rows": n_id,
                      "privatizations": reps,
                      "tokens_used": adapter.meta["tokens"], "held_out_rows": hold},
           "config": asdict(cfg), "steps": adapter.meta["steps"],
           "stopped": adapter.meta["stopped"], "cpu_s_per_step_probe": per_step,
           "train_wall_s": train_wall, "train_cpu_s": train_cpu,
           "last_train_record": adapter.meta["last"], "saved_to": args.save,
           **_losses(bb, adapted, (held_clean, held_priv), (ev_clean, ev_priv), kw),
           "probe": linear_probe(bb, adapted, priv_for, 100 if args.quick else args.probe_n,
                                 args.max_length, args.task) if args.probe_n else None}
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    out["total_wall_s"] = time.perf_counter() - t_start
    name = args.name or ("channel_adapter_quick" if args.quick else "channel_adapter")
    RESULTS.mkdir(exist_ok=True)
    write_json(RESULTS / f"{name}.json", out)
    write_md(RESULTS / f"{name}.md", markdown(out))
    print(markdown(out))


def _losses(bb, adapted, held: tuple, dev: tuple, kw: dict) -> dict:
    """Distillation losses of the raw and the adapted backbone on held-out public rows and
    on the task's dev rows (and the adapted one's drift on clean dev rows)."""
    (held_clean, held_priv), (ev_clean, ev_priv) = held, dev
    return {"held_out_public": {"raw": distillation_loss(bb, bb, held_clean, held_priv, **kw),
                                "adapted": distillation_loss(bb, adapted, held_clean,
                                                             held_priv, **kw)},
            "task_dev": {"raw": distillation_loss(bb, bb, ev_clean, ev_priv, **kw),
                         "adapted": distillation_loss(bb, adapted, ev_clean, ev_priv, **kw),
                         "adapted on clean rows (drift)": distillation_loss(
                             bb, adapted, ev_clean, ev_clean, **kw)}}


def _task(o: dict) -> str:
    return {"sst2": "SST-2", "financial_phrasebank": "FP"}[o.get("task", "sst2")]


def _dev_key(o: dict) -> str:
    return "task_dev" if "task_dev" in o else "sst2_dev"  # results written before --task


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times (fresh noise each)"


def markdown(o: dict) -> str:
    c, m = o["config"], o["machine"]
    stop = ", stopped at the budget" if o["stopped"] else ""
    sources = ", ".join(f"{s['name']}/{s['split']} {s['texts']}"
                        for s in o["corpus"]["sources"]["sources"])
    lines = [
        "# Channel adapter: MiniLM reading privatized text (issue 27, remedy b)", "",
        f"`{o['command']}` on {m['platform']}, {m['cpu_count']} CPUs shared, {m['threads']} "
        f"thread(s); load {m['loadavg_start'][0]:.1f} before, {m['loadavg_end'][0]:.1f} after.",
        "",
        f"η = {o['eta']:.4g} (calibrated for P ≈ {o['target_p']} on rapt's public sample); P "
        f"measured {o['P_train']:.3f} on the training pairs, {o['P_eval']:.3f} on "
        f"{_task(o)} dev.", "",
        f"LoRA r {c['lora_r']} (alpha {c['lora_alpha']}) on every block's attention and "
        f"feed-forward projections, lr {c['lr']}, batch {c['batch_size']}, max length "
        f"{c['max_length']}, loss = per-token MSE at text positions + {c['pooled_weight']:g} × "
        f"MSE of the mean-pooled vector. Trained on {o['corpus']['rows_used']:,} public "
        f"sentences ({o['corpus']['tokens_used']:,} tokens; {sources}) privatized "
        f"{_times(o['corpus'].get('privatizations', 1))}: "
        f"{o['corpus']['identity_rows']:,} of them also as unprivatized (clean, clean) pairs, "
        "so that the adapter leaves clean text (label descriptions) as the backbone reads it: "
        f"{o['steps']} steps ({c['epochs']} epoch(s) planned{stop}), "
        f"{o['train_cpu_s'] / 60:.1f} CPU-min ({o['train_wall_s'] / 60:.1f} min wall).", "",
        "| rows | reader | loss | token MSE | pooled MSE | pooled cos (privatized vs clean) |",
        "|---|---|---|---|---|---|"]
    for where, key in (("held-out public (fresh noise)", "held_out_public"),
                       (f"{_task(o)} dev (fresh noise)", _dev_key(o))):
        for reader, r in o[key].items():
            lines.append(f"| {where} | {reader} | {r['loss']:.4f} | {r['hidden_mse']:.4f} | "
                         f"{r['pooled_mse']:.4f} | {r['pooled_cos']:.3f} |")
    p = o["probe"]
    if p is None:
        return "\n".join(lines) + "\n"
    lines += ["", f"Linear probe on frozen mean-pooled features ({p['train_rows']:,} "
              f"{_task(o)} train sentences, scored on {p['dev_rows']} dev sentences, "
              "privatized alike):", "",
              "| features | accuracy |", "|---|---|"]
    lines += [f"| {k} | {p[k]:.1%} |" for k in
              ("clean", "privatized, raw backbone", "privatized, adapted backbone")]
    gap = p["clean"] - p["privatized, raw backbone"]
    won = p["privatized, adapted backbone"] - p["privatized, raw backbone"]
    if gap > 0:
        lines += ["", f"Share of the probe's privatization gap won back: {won / gap:.0%} "
                  f"({won * 100:+.1f} of {gap * 100:.1f} points; one split, no CI)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
