"""PromptDPSGD benchmark: step cost and a Flocks Table 1-shaped accuracy table on SST-2.

Part ``speed`` (side by side, one process, interleaved repeats, median):
  * non-private prompt-tuning step (loss.mean().backward(), optimizer step),
  * PromptDPSGD step (broadcast per-example grads, clip, noise, optimizer step),
  * the same DP step through a generic per-sample-gradient engine: ``torch.func``
    ``vmap(grad(loss))`` over the whole MiniLM with the prompt, then clip + noise.
  Goals: DP / non-private ≤ 1.15, generic / DP ≥ 3.
Part ``table``: soft prompt and prefix at ε = 8, 3, ∞ with ``rapt.trainer.tune`` on a stated
  subset of GLUE SST-2 train, accuracy on the full SST-2 dev set (CPU profile).

    python benchmarks/bench_dpsgd.py --part speed
    python benchmarks/bench_dpsgd.py --part table
Writes benchmarks/results/dpsgd_speed.{json,md} and dpsgd_table.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "loadavg_start": os.getloadavg()}


# --------------------------------------------------------------------------- speed


def _variants(bb, method: str, ids: torch.Tensor, mask: torch.Tensor, y: torch.Tensor,
              P: int) -> dict:
    """Step functions for one method: non-private, PromptDPSGD, and (prompt) generic vmap."""
    from torch.func import grad, vmap

    from rapt.dp import DPSGD, DPConfig
    from rapt.trainer import RaptModel, TuneConfig

    B = ids.shape[0]
    emb = bb.model.get_input_embeddings()

    def make(m: str) -> RaptModel:
        model = RaptModel(bb, TuneConfig(method=m, num_virtual_tokens=P), 2)
        model.eval()  # dropout off in every variant: identical arithmetic apart from DP work
        return model

    m_np, m_dp = make(method), make(method)
    opt_np = torch.optim.AdamW([p for p in m_np.parameters() if p.requires_grad], lr=1e-2)
    opt_dp = torch.optim.AdamW([p for p in m_dp.parameters() if p.requires_grad], lr=1e-2)
    n_data = 100 * B
    dp = DPSGD(m_dp, DPConfig(noise_multiplier=1.0, max_grad_norm=0.1, sample_rate=B / n_data,
                              physical_batch_size=B), n_examples=n_data, steps=1000, seed=0)

    def step_nonprivate() -> None:
        logits, _, _ = m_np(ids, mask)
        F.cross_entropy(logits, y).backward()
        opt_np.step()
        opt_np.zero_grad(set_to_none=True)

    def step_dp() -> None:
        logits, _, _ = m_dp(ids, mask)
        F.cross_entropy(logits, y, reduction="none").sum().backward()
        dp.accumulate()
        dp.finalize()
        opt_dp.step()
        opt_dp.zero_grad(set_to_none=True)

    variants = {"nonprivate": step_nonprivate, "promptdpsgd": step_dp}
    if method != "prompt":
        return variants
    m_g = make("prompt")
    prompt, lin = m_g.tuner.prompt, m_g.head.linear
    gparams = {"prompt": prompt, "w": lin.weight, "b": lin.bias}
    opt_g = torch.optim.AdamW(list(gparams.values()), lr=1e-2)
    noise_gen = torch.Generator().manual_seed(0)

    def loss_one(p: dict, i: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = torch.cat([p["prompt"][None], emb(i[None])], 1)
        h = bb.model(inputs_embeds=x).last_hidden_state[:, P:]
        return F.cross_entropy(F.linear(h.mean(1), p["w"], p["b"]), t[None])

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def step_generic() -> None:
        gs = per_sample({k: v.detach() for k, v in gparams.items()}, ids, y)
        flat = torch.cat([v.reshape(B, -1) for v in gs.values()], 1)
        f = (0.1 / (flat.norm(dim=1) + 1e-6)).clamp(max=1.0)
        for k, par in gparams.items():
            s = torch.tensordot(f, gs[k], dims=1)
            par.grad = (s + torch.normal(0.0, 0.1, size=s.shape, generator=noise_gen)) / B
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)

    variants["generic_vmap_sdpa"] = step_generic

    m_l = make("prompt")
    lparams = [p for p in m_l.parameters() if p.requires_grad]
    opt_l = torch.optim.AdamW(lparams, lr=1e-2)

    def step_loop() -> None:
        """Per-example gradients by B single-example backward passes (the naive baseline)."""
        sums = [torch.zeros_like(p) for p in lparams]
        for b in range(B):
            logits, _, _ = m_l(ids[b:b + 1], mask[b:b + 1])
            F.cross_entropy(logits, y[b:b + 1]).backward()
            norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in lparams))
            f = (0.1 / (norm + 1e-6)).clamp(max=1.0)
            for s, p in zip(sums, lparams, strict=True):
                s.add_(p.grad, alpha=float(f))
                p.grad = None
        for s, p in zip(sums, lparams, strict=True):
            p.grad = (s + torch.normal(0.0, 0.1, size=s.shape, generator=noise_gen)) / B
        opt_l.step()
        opt_l.zero_grad(set_to_none=True)

    variants["naive_loop"] = step_loop
    return variants


def bench_speed(args) -> dict:
    from rapt.models import load_backbone

    bb = load_backbone("minilm")
    B, T, P = args.physical_batch, args.length, args.virtual_tokens
    g = torch.Generator().manual_seed(0)
    # Real-vocabulary ids, full length (no padding): every variant does the same attention work.
    ids = torch.randint(1000, bb.embeddings.shape[0], (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    y = torch.randint(0, 2, (B,), generator=g)

    results: dict = {}
    for method in args.methods:
        variants = _variants(bb, method, ids, mask, y, P)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():  # warm-up (allocator, lazy init)
            fn()
        for _ in range(args.repeats):
            for k, fn in variants.items():  # interleaved: load changes hit all variants alike
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        res = {"median_s": med, "all_s": times,
               "ratio_dp_over_nonprivate": med["promptdpsgd"] / med["nonprivate"]}
        if "generic_vmap_sdpa" in med:
            res["ratio_generic_over_dp"] = med["generic_vmap_sdpa"] / med["promptdpsgd"]
            res["ratio_loop_over_dp"] = med["naive_loop"] / med["promptdpsgd"]
        results[method] = res
        print(method, json.dumps({k: round(v, 4) for k, v in med.items()}), flush=True)
    return {"settings": {"backbone": "minilm", "physical_batch": B, "length": T,
                         "virtual_tokens": P, "repeats": args.repeats,
                         "generic_engine": "torch.func vmap(grad) over MiniLM + prompt + head "
                                           "(SDPA attention; its backward has no vmap batching "
                                           "rule, torch falls back to a per-example loop)"},
            "results": results}


def _fmt(x: float | None, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def write_speed(out: dict) -> None:
    lines = ["# PromptDPSGD step cost (MiniLM, CPU)", "",
             f"Command: `{out['command']}`  ",
             f"Load average at start: {out['machine']['loadavg_start']}, "
             f"threads: {out['machine']['torch_threads']}", "",
             f"Physical batch {out['settings']['physical_batch']}, length "
             f"{out['settings']['length']}, {out['settings']['virtual_tokens']} virtual tokens, "
             f"median of {out['settings']['repeats']} interleaved repeats.", "",
             "| method | non-private step (s) | PromptDPSGD step (s) | generic vmap step (s) "
             "| naive loop step (s) | DP / non-private (goal ≤ 1.15) | generic vmap / DP "
             "(goal ≥ 3) | naive loop / DP |",
             "|---|---|---|---|---|---|---|---|"]
    for method, r in out["results"].items():
        m = r["median_s"]
        gen = m.get("generic_vmap_sdpa")
        lines.append(
            f"| {method} | {m['nonprivate']:.3f} | {m['promptdpsgd']:.3f} | "
            f"{_fmt(gen, 3)} | {_fmt(m.get('naive_loop'), 3)} | "
            f"{r['ratio_dp_over_nonprivate']:.3f} | {_fmt(r.get('ratio_generic_over_dp'), 2)} | "
            f"{_fmt(r.get('ratio_loop_over_dp'), 2)} |")
    lines += ["", f"Generic engine: {out['settings']['generic_engine']}. Naive loop: B "
              "single-example forward/backward passes, clip, sum, noise.", ""]
    for method, r in out["results"].items():
        ok = r["ratio_dp_over_nonprivate"] <= 1.15
        lines.append(f"- {method}: DP / non-private = {r['ratio_dp_over_nonprivate']:.3f} — "
                     f"goal ≤ 1.15 {'met' if ok else 'NOT met'}.")
        if "ratio_generic_over_dp" in r:
            ok = r["ratio_generic_over_dp"] >= 3
            lines.append(f"- {method}: generic vmap / DP = {r['ratio_generic_over_dp']:.2f} — "
                         f"goal ≥ 3 {'met' if ok else 'NOT met'}.")
    lines += ["", "Why the generic engine is not much slower here: the backbone is frozen, so a "
              "per-sample engine only needs per-example gradients of the small prompt and head; "
              "`vmap` turns the per-example backward through MiniLM into the same batched "
              "matmuls as the ordinary backward, and on a CPU (compute-bound, no kernel-launch "
              "cost) its overhead is small. The gap may be larger on a GPU, where the SDPA "
              "backward "
              "fallback loops over examples one kernel launch at a time (not measured: no GPU "
              "in this run). Opacus `GradSampleModule` could not be measured: its "
              "functorch fallback calls the tuner with a single input, and the tuner takes "
              "(input_ids, attention_mask)."]
    (RESULTS / f"dpsgd_speed{out.get('tag', '')}.md").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- table


def bench_table(args) -> dict:
    from rapt.data import load_dataset
    from rapt.dp import DPConfig
    from rapt.models import load_backbone
    from rapt.trainer import TuneConfig, tune

    bb = load_backbone("minilm")
    tok = bb.tokenizer
    train = load_dataset("sst2", "train").subset(args.n_train, seed=0)
    dev = load_dataset("sst2", "dev")
    if args.n_dev:
        dev = dev.subset(args.n_dev, seed=0)

    def encode(texts: list[str]) -> list[list[int]]:
        return tok(texts, truncation=True, max_length=args.length)["input_ids"]

    x_tr, y_tr = encode(train.texts), train.labels
    x_dev, y_dev = encode(dev.texts), dev.labels
    rows = []
    for method in args.methods:
        for eps in args.epsilons:
            if eps == "inf":
                dp = None
            elif eps == "clip":  # diagnostic: DP-SGD clipping and sampling, σ = 0 (ε = ∞)
                dp = DPConfig(noise_multiplier=0.0, max_grad_norm=args.clip,
                              physical_batch_size=args.physical_batch)
            else:
                dp = DPConfig(target_epsilon=float(eps), max_grad_norm=args.clip,
                              physical_batch_size=args.physical_batch)
            cfg = TuneConfig(method=method, num_virtual_tokens=args.tokens[method],
                             lr=args.lr[method], epochs=args.epochs, batch_size=args.batch,
                             max_length=args.length, seed=0, dp=dp, warmup_ratio=0.0)
            t0 = time.perf_counter()
            res = tune(bb, x_tr, y_tr, 2, cfg)
            train_s = time.perf_counter() - t0
            pred = res.predict(bb, x_dev)
            acc = sum(int(p == t) for p, t in zip(pred, y_dev, strict=True)) / len(y_dev)
            rec = res.meta["dp"] or {}
            row = {"method": method, "target_epsilon": eps, "accuracy": acc,
                   "epsilon_spent": rec.get("epsilon", float("inf")), "delta": rec.get("delta"),
                   "noise_multiplier": rec.get("noise_multiplier"),
                   "max_grad_norm": rec.get("max_grad_norm"),
                   "sample_rate": rec.get("sample_rate"), "steps": res.meta["steps"],
                   "accountant": rec.get("accountant"), "train_seconds": round(train_s, 1),
                   "n_trainable": sum(v.numel() for v in res.tensors.values())}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"settings": {"backbone": "minilm", "data": "GLUE SST-2", "n_train": len(x_tr),
                         "n_dev": len(x_dev), "epochs": args.epochs, "logical_batch": args.batch,
                         "physical_batch": args.physical_batch, "clip": args.clip,
                         "lr": args.lr, "virtual_tokens": args.tokens,
                         "max_length": args.length, "optimizer": "AdamW (rapt.trainer)",
                         "delta": "1/N"},
            "rows": rows,
            "paper_table1_sst2_roberta_base": {"prompt": {"8": 92.31, "3": 90.48, "inf": 95.64},
                                               "prefix": {"8": 91.97, "3": 90.37, "inf": 96.33}}}


def write_table(out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = out["settings"]
    lines = ["# PromptDPSGD on SST-2 (Flocks Table 1 shape, MiniLM, CPU profile)", "",
             f"Command: `{out['command']}`  ",
             f"Load average at start: {out['machine']['loadavg_start']}", "",
             f"Train: {s['n_train']} random GLUE SST-2 train examples (seed 0), {s['epochs']} "
             f"epochs, logical (Poisson) batch {s['logical_batch']} (q = batch/N), physical "
             f"batch {s['physical_batch']}, clip C = {s['clip']}, δ = 1/N, lr {s['lr']}, "
             f"virtual tokens {s['virtual_tokens']}, max length {s['max_length']}. Accuracy on "
             f"{s['n_dev']} SST-2 dev examples. Paper: RoBERTa-base, full SST-2, batch 1024, "
             "tuned per cell.", "",
             "| method | target ε | ε spent (δ=1/N) | σ | steps | accuracy (%) | paper (%) "
             "| train s |", "|---|---|---|---|---|---|---|---|"]
    paper = out["paper_table1_sst2_roberta_base"]
    for r in out["rows"]:
        eps = r["epsilon_spent"]
        lines.append(
            f"| {r['method']} | {r['target_epsilon']} | "
            f"{'∞' if eps == float('inf') else _fmt(eps, 2)} | {_fmt(r['noise_multiplier'], 3)} | "
            f"{r['steps']} | {100 * r['accuracy']:.2f} | "
            f"{_fmt(paper[r['method']].get(str(r['target_epsilon'])), 2)} | "
            f"{r['train_seconds']} |")
    lines += ["", "target ε `clip` = the DP-SGD loop with σ = 0 (Poisson sampling and clipping "
              "only, no guarantee): separates the cost of clipping from the cost of noise."]
    (RESULTS / f"dpsgd_table{out.get('tag', '')}.md").write_text("\n".join(lines) + "\n")

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    order = ["3", "8", "inf"]
    for method, marker in (("prompt", "o"), ("prefix", "s")):
        rs = {str(r["target_epsilon"]): r for r in out["rows"] if r["method"] == method}
        xs = [e for e in order if e in rs]
        if xs:
            ax.plot(xs, [100 * rs[e]["accuracy"] for e in xs], marker=marker,
                    label=f"{method} (MiniLM, CPU profile)")
            ax.plot(xs, [paper[method][e] for e in xs], marker=marker, ls="--", alpha=0.5,
                    label=f"{method} (paper, RoBERTa-base)")
    ax.set_xlabel("ε (δ = 1/N)")
    ax.set_ylabel("SST-2 dev accuracy (%)")
    ax.set_title("PromptDPSGD privacy-utility")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"dpsgd_table{out.get('tag', '')}.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["speed", "table"], required=True)
    ap.add_argument("--methods", nargs="+", default=["prompt", "prefix"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--physical-batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--virtual-tokens", type=int, default=10,
                    help="prompt length (speed: both methods; table: soft prompt)")
    ap.add_argument("--prefix-tokens", type=int, default=1,
                    help="table: prefix length (Flocks App. E uses 1 for SST-2 prefix at ε=8)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--epsilons", nargs="+", default=["8", "3", "inf"],
                    help="table: target ε values; 'inf' = non-private, 'clip' = σ = 0")
    ap.add_argument("--tag", default="", help="suffix for the result file names")
    ap.add_argument("--n-train", type=int, default=1400)
    ap.add_argument("--n-dev", type=int, default=0, help="0 = the full dev set (872)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lr-prompt", type=float, default=3e-2)
    ap.add_argument("--lr-prefix", type=float, default=3e-2)
    args = ap.parse_args()
    args.lr = {"prompt": args.lr_prompt, "prefix": args.lr_prefix}
    args.tokens = {"prompt": args.virtual_tokens, "prefix": args.prefix_tokens}
    torch.set_num_threads(args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    head = {"command": "python " + " ".join(sys.argv), "machine": machine(), "tag": args.tag}
    t0 = time.perf_counter()
    if args.part == "speed":
        out = {**head, **bench_speed(args)}
    else:
        out = {**head, **bench_table(args)}
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    out["machine"]["loadavg_end"] = os.getloadavg()
    (RESULTS / f"dpsgd_{args.part}{args.tag}.json").write_text(json.dumps(out, indent=2) + "\n")
    (write_speed if args.part == "speed" else write_table)(out)
    print(f"wrote {RESULTS}/dpsgd_{args.part}{args.tag}.* in {out['wall_seconds']} s")


if __name__ == "__main__":
    main()
