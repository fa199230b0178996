"""RAPT Table 1 / Figure 3 on MiniLM: +privatization vs +reconstruction at three privacy levels.

Grid: tasks (SST-2 whole sentences, TrustPilot rating) x methods (prompt, prefix) x
{no privacy, +privatization, +reconstruction} x privacy levels matched by replacement
probability P x seeds. Plus, measured side by side in one run, the step-time ratio of RAPT
(reconstruction head on) vs plain prompt tuning at equal batch and row length, and the
attribute inference attack (TrustPilot gender/age) on the prefix-tuned models' states and on the
privatized input embeddings.

    python benchmarks/bench_rapt.py                   # CPU profile (subsets, stated in the table)
    python benchmarks/bench_rapt.py --profile paper   # paper-sized run, for a GPU

Results: benchmarks/results/rapt.{json,md,png}; the JSON is rewritten after every run, so an
interrupted run keeps what it finished.
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

from rapt.attacks.attribute import attribute_attack, embedding_features, hidden_features
from rapt.data import load_dataset
from rapt.demo import plain_tokens_for
from rapt.models import load_backbone
from rapt.noise import NoiseSource
from rapt.privatization import (
    Privatizer,
    calibrate_eta,
    candidate_ids_from_tokenizer,
    replacement_probability,
)
from rapt.reconstruction import build_rows, plain_offset, privatize_rows, sample_plain_tokens
from rapt.trainer import TuneConfig, tune

PROFILES = {
    # Sized so that the whole grid finishes in about 25 minutes on 2 CPU cores when they are
    # not shared (a step is ~0.2-0.4 s then; under load 8 it is 10-20x slower).
    "cpu": dict(plain_sequences=1, train=640, test=600, max_length=40, plain_len=16, epochs=2,
                batch_size=16,
                seeds=3, prompt_tokens=10, prefix_tokens=10, levels=(0.6, 0.4, 0.2),
                attack_train=300, attack_test=200, lr={"prompt": 2e-2, "prefix": 1e-2},
                tasks=("sst2", "trustpilot"), methods=("prompt", "prefix")),
    # The paper's setting (BERT-base there): full data, 4 epochs, batch 128, length 128,
    # prompt 150 / prefix 10, m = 40, 5 seeds.
    "paper": dict(plain_sequences=1, train=None, test=None, max_length=128, plain_len=40,
                  epochs=4, batch_size=128,
                  seeds=5, prompt_tokens=150, prefix_tokens=10, levels=(0.6, 0.4, 0.2),
                  attack_train=2000, attack_test=1000, lr={"prompt": 3e-2, "prefix": 1e-2},
                  tasks=("sst2", "trustpilot"), methods=("prompt", "prefix")),
}
TASKS = {"sst2": ("sst2-sentences", "train", "dev"), "trustpilot": ("trustpilot", "a", "b")}


def _acc(pred, gold) -> float:
    return sum(int(a == b) for a, b in zip(pred, gold, strict=True)) / len(gold)


def _machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "loadavg_start": list(os.getloadavg())}


def step_time_ratio(bb, rows, labels, plain, cfg_kw: dict, steps: int, repeats: int,
                    rec_vocab_size: int = 7630) -> dict:
    """Train-step time (forward, backward, AdamW) with vs without the reconstruction head
    (h -> 96 -> |T| = 7630 on the m plain positions) on the *same* batches (equal batch and
    length), alternating the two so a busy machine slows both alike."""
    from torch import nn

    from rapt.reconstruction import reconstruction_loss
    from rapt.trainer import RaptModel, pad_batch

    cfg = TuneConfig(**cfg_kw)
    off, m = plain_offset(bb.tokenizer), len(plain)
    models = {rec: RaptModel(bb, cfg, 2, list(range(rec_vocab_size)) if rec else None, m, off)
              for rec in (True, False)}
    opts = {rec: torch.optim.AdamW([p for p in mod.parameters() if p.requires_grad], lr=1e-3)
            for rec, mod in models.items()}
    B = cfg.batch_size
    batches = [pad_batch(rows[i * B:(i + 1) * B], bb.tokenizer.pad_token_id)
               for i in range(steps)]
    ys = [torch.tensor(labels[i * B:(i + 1) * B]) for i in range(steps)]
    tgt = torch.randint(rec_vocab_size, (B, m), generator=torch.Generator().manual_seed(0))

    def step(rec: bool, i: int) -> float:
        mod, opt = models[rec], opts[rec]
        (ids, mask), y = batches[i % steps], ys[i % steps]
        t = time.perf_counter()
        logits, r, _ = mod(ids, mask)
        loss = nn.functional.cross_entropy(logits, y, reduction="none")
        if r is not None:
            loss = loss + reconstruction_loss(r, tgt[: len(y)])
        loss.mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    step(True, 0), step(False, 0)  # warm-up
    # Interleaved step by step (order alternating), so both see the same machine load; the
    # median of the per-pair ratios is robust to the spikes of a shared machine.
    t_rec, t_plain = [], []
    for i in range(repeats):
        for rec in ((True, False) if i % 2 == 0 else (False, True)):
            (t_rec if rec else t_plain).append(step(rec, i))
    ratios = [a / b for a, b in zip(t_rec, t_plain, strict=True)]
    return {"rapt_step_s": statistics.median(t_rec), "plain_step_s": statistics.median(t_plain),
            "ratio": statistics.median(ratios),
            "ratio_of_medians": statistics.median(t_rec) / statistics.median(t_plain),
            "ratio_p25_p75": [float(x) for x in statistics.quantiles(ratios, n=4)[::2]],
            "pairs": repeats, "method": cfg.method,
            "batch_size": B, "rec_vocab_size": rec_vocab_size, "plain_len": m,
            "row_length_max": max(len(r) for r in rows[: steps * B])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tasks", default=None, help="comma list (default: the profile's)")
    ap.add_argument("--methods", default=None)
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--train", type=int, default=None)
    ap.add_argument("--plain-sequences", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--skip-attack", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--timing-only", action="store_true")
    ap.add_argument("--timing-pairs", type=int, default=16)
    ap.add_argument("--name", default="rapt", help="result file stem")
    ap.add_argument("--render", action="store_true",
                    help="only re-render the .md/.png from an existing (partial) .json")
    args = ap.parse_args()
    if args.render:
        path = Path(args.out) / f"{args.name}.json"
        old = json.loads(path.read_text())
        old["summary"] = summarize(old)
        path.write_text(json.dumps(old, indent=1) + "\n")
        (Path(args.out) / f"{args.name}.md").write_text(markdown(old) + "\n")
        plot(old, Path(args.out) / f"{args.name}.png")
        print(markdown(old))
        return
    prof = dict(PROFILES[args.profile])
    for k in ("seeds", "train", "epochs", "plain_sequences"):
        if getattr(args, k) is not None:
            prof[k] = getattr(args, k)
    tasks = args.tasks.split(",") if args.tasks else list(prof["tasks"])
    methods = args.methods.split(",") if args.methods else list(prof["methods"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict = {"command": " ".join([sys.executable, *sys.argv]), "machine": _machine(),
                 "profile": args.profile, "settings": {**prof, "tasks": tasks,
                                                       "methods": methods},
                 "levels": {}, "runs": [], "timing": None, "attack": []}
    t_start = time.perf_counter()

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - t_start
        res["machine"]["loadavg_end"] = list(os.getloadavg())
        (out_dir / f"{args.name}.json").write_text(json.dumps(res, indent=1) + "\n")

    bb = load_backbone("minilm")
    tok, special = bb.tokenizer, bb.special_ids
    cand = candidate_ids_from_tokenizer(tok, bb.embeddings.shape[0])
    plain0 = sample_plain_tokens(tok, prof["plain_len"], seed=0)
    L = prof["max_length"]

    data = {}
    for task in tasks:
        name, tr_split, te_split = TASKS[task]
        tr, te = load_dataset(name, tr_split), load_dataset(name, te_split)
        if prof["train"]:
            tr = tr.subset(min(prof["train"], len(tr)), seed=0)
        if prof["test"]:
            te = te.subset(min(prof["test"], len(te)), seed=0)
        data[task] = (tr, te)

    def base_kw(method: str, seed: int) -> dict:
        return dict(method=method, lr=prof["lr"][method], epochs=prof["epochs"],
                    batch_size=prof["batch_size"], max_length=L, seed=seed,
                    num_virtual_tokens=prof[f"{method}_tokens"])

    if not args.skip_timing:
        tr, _ = data[tasks[0]]
        rows = build_rows(tok, tr.texts, L, plain0)
        res["timing"] = step_time_ratio(bb, rows, tr.labels, plain0, base_kw("prompt", 0),
                                        steps=4, repeats=args.timing_pairs)
        print("timing", json.dumps(res["timing"]), flush=True)
        if not args.timing_only:  # timing-only merges into an existing result instead
            save()
    if args.timing_only:
        _merge_timing(out_dir / f"{args.name}.json", res, out_dir, args.name)
        return

    # η per privacy level: calibrated on SST-2 training tokens so that P hits the target.
    tr0 = data[tasks[0]][0]
    sample = torch.tensor([t for r in build_rows(tok, tr0.texts[:150], L) for t in r
                           if t not in set(special)])
    etas = {}
    for p in prof["levels"]:
        etas[p] = calibrate_eta(bb.embeddings, p, sample, special, candidate_ids=cand,
                                mode="fast")
        print(f"target P {p}: η = {etas[p]:.2f}", flush=True)

    prepared = {}
    for task in tasks:
        tr, te = data[task]
        plain, pidx = plain_tokens_for(tok, prof["plain_len"], prof["plain_sequences"],
                                       len(tr), 0)
        withk = (build_rows(tok, tr.texts, L, plain, pidx),
                 build_rows(tok, te.texts, L, plain, None if pidx is None else [0] * len(te)))
        off, m = plain_offset(tok), prof["plain_len"]
        # Clean rows = the same rows without k, so every setting sees the same text tokens.
        clean = tuple([r[:off] + r[off + m:] for r in rows] for rows in withk)
        priv = {}
        for p, eta in etas.items():
            pz = Privatizer(bb.embeddings, eta, special_ids=special, candidate_ids=cand,
                            mode="fast", seed=0)
            # Seeded on purpose: a benchmark must be repeatable (its rows carry no guarantee).
            g = NoiseSource(1)
            pk = [privatize_rows(r, pz, g) for r in withk]
            # The mechanism noises every token independently, so dropping the privatized plain
            # tokens from [k; x] gives exactly the distribution of privatizing x alone: one
            # privatization pass serves both the +privatization and the +reconstruction rows.
            px = [[r[:off] + r[off + m:] for r in rows] for rows in pk]
            priv[p] = (px, pk)
            measured = replacement_probability(clean[0], px[0], special)
            res["levels"].setdefault(task, {})[str(p)] = {"eta": etas[p], "P": measured}
            print(f"{task} P target {p}: η {eta:.2f} measured P {measured:.3f}", flush=True)
        res.setdefault("majority_rate", {})[task] = max(
            te.labels.count(c) for c in set(te.labels)) / len(te)
        prepared[task] = (plain, pidx, clean, priv)

    # Seeds outermost: an interrupted run still has every cell of the grid for seed 0.
    for seed in range(prof["seeds"]):
        for task in tasks:
            tr, te = data[task]
            C = len(tr.label_names)
            plain, pidx, clean, priv = prepared[task]
            for method in methods:
                if method not in prof.get("task_methods", {}).get(task, methods):
                    continue
                settings = [("no privacy", None, clean, False)]
                for p in prof["levels"]:
                    settings += [("+privatization", p, priv[p][0], False),
                                 ("+reconstruction", p, priv[p][1], True)]
                for setting, p, (rtr, rte), rec in settings:
                    t = time.perf_counter()
                    cfg = TuneConfig(**base_kw(method, seed), reconstruction=rec)
                    tuned = tune(bb, rtr, tr.labels, C, cfg, plain_ids=plain if rec else None,
                                 plain_index=pidx if rec else None)
                    acc = _acc(tuned.predict(bb, rte), te.labels)
                    hist = tuned.meta["history"]
                    tail = hist[-max(1, len(hist) // 5):]
                    run = {"task": task, "method": method, "setting": setting, "P": p,
                           "eta": etas.get(p), "seed": seed, "accuracy": acc,
                           "steps": tuned.meta["steps"],
                           "train_s": round(time.perf_counter() - t, 1),
                           "final_task_loss": sum(h["task_loss"] for h in tail) / len(tail)}
                    if rec:
                        run["final_rec_acc"] = sum(h["rec_acc"] for h in tail) / len(tail)
                    res["runs"].append(run)
                    print(json.dumps(run), flush=True)
                    res["summary"] = summarize(res)
                    save()
                    if (task == "trustpilot" and method == "prefix" and seed == 0
                            and not args.skip_attack and setting != "no privacy"):
                        res["attack"] += _attack(bb, tuned, setting, p, etas.get(p), prof,
                                                 cand)
                        save()
    res["summary"] = summarize(res)
    save()
    (out_dir / f"{args.name}.md").write_text(markdown(res) + "\n")
    plot(res, out_dir / f"{args.name}.png")
    print(markdown(res))


def _merge_timing(path: Path, res: dict, out_dir: Path, name: str) -> None:
    """--timing-only next to an existing grid result: replace its timing and re-render."""
    if not path.exists():
        return
    old = json.loads(path.read_text())
    if not old.get("runs"):
        return
    old["timing"] = res["timing"]
    old["timing_machine"] = res["machine"]
    old["timing_command"] = res["command"]
    path.write_text(json.dumps(old, indent=1) + "\n")
    (out_dir / f"{name}.md").write_text(markdown(old) + "\n")
    plot(old, out_dir / f"{name}.png")


_ATTACK_CACHE: dict = {}


def _attack(bb, tuned, setting: str, p, eta, prof: dict, cand) -> list[dict]:
    """Gender/age attack on TrustPilot split b users (disjoint from the tuning data)."""
    special = bb.special_ids
    out = []
    for attr in ("gender", "age"):
        if attr not in _ATTACK_CACHE:
            ds = load_dataset("trustpilot", "b", attribute=attr)
            ds = ds.subset(min(len(ds), prof["attack_train"] + prof["attack_test"]), seed=0)
            _ATTACK_CACHE[attr] = ds
        ds = _ATTACK_CACHE[attr]
        n = prof["attack_train"]
        rows = tuned.encode(bb, ds.texts)
        pz = Privatizer(bb.embeddings, eta, special_ids=special, candidate_ids=cand,
                        mode="fast", seed=7)
        rows = privatize_rows(rows, pz, NoiseSource(7))
        feats = {"privatized input embeddings": embedding_features(bb, rows),
                 "tuned last-layer states": hidden_features(bb, rows, tuned)}
        for fname, x in feats.items():
            if fname.startswith("privatized") and setting == "+reconstruction":
                continue  # same privatized inputs as the +privatization row
            r = attribute_attack(x[:n], ds.labels[:n], x[n:], ds.labels[n:], attribute=attr,
                                 feature=fname, seed=0)
            row = {"setting": setting, "P": p, **r.as_dict()}
            out.append(row)
            print("attack", json.dumps(row), flush=True)
    return out


def summarize(res: dict) -> list[dict]:
    groups: dict = {}
    for r in res["runs"]:
        groups.setdefault((r["task"], r["method"], r["setting"], r["P"]), []).append(
            r["accuracy"])
    return [{"task": k[0], "method": k[1], "setting": k[2], "P": k[3],
             "mean": statistics.mean(v), "std": statistics.pstdev(v) if len(v) > 1 else 0.0,
             "n": len(v)} for k, v in groups.items()]


def markdown(res: dict) -> str:
    s = res["settings"]
    levels = list(s["levels"])
    summ = {(r["task"], r["method"], r["setting"], r["P"]): r for r in res.get("summary", [])}
    lines = [f"# RAPT on MiniLM ({res['profile']} profile)", "",
             f"Subsets: {s['train'] or 'all'} training / {s['test'] or 'all'} test examples per "
             f"task, max length {s['max_length']}, {s['epochs']} epochs, batch {s['batch_size']},"
             f" {s['plain_len']} plain tokens, prompt {s['prompt_tokens']} / prefix "
             f"{s['prefix_tokens']} virtual tokens, lr {s['lr']}, {s['seeds']} seed(s) "
             "(mean ± std over seeds). Accuracy on privatized test queries.", ""]
    head = "| task | method | setting | " + " | ".join(
        f"P≈{p} (η={res['levels'].get(t, {}).get(str(p), {}).get('eta', float('nan')):.0f})"
        for t in s["tasks"][:1] for p in levels) + " | avg |"
    lines += [head, "|---|---|---|" + "---|" * (len(levels) + 1)]
    for task in s["tasks"]:
        for method in s["methods"]:
            for setting in ("no privacy", "+privatization", "+reconstruction"):
                cells = []
                for p in levels:
                    r = summ.get((task, method, setting, None if setting == "no privacy" else p))
                    cells.append(f"{100 * r['mean']:.1f} ± {100 * r['std']:.1f}" if r else "–")
                vals = [summ[(task, method, setting, None if setting == "no privacy" else p)]
                        ["mean"] for p in levels
                        if (task, method, setting, None if setting == "no privacy" else p)
                        in summ]
                avg = f"{100 * statistics.mean(vals):.1f}" if vals else "–"
                lines.append(f"| {task} | {method} | {setting} | " + " | ".join(cells)
                             + f" | {avg} |")
    lines += ["", "Test majority-class rate: " + ", ".join(
        f"{t}: {100 * v:.1f}" for t, v in res.get("majority_rate", {}).items())]
    lines += ["", "Measured P per task: " + "; ".join(
        f"{t}: " + ", ".join(f"{v['P']:.3f}" for v in lv.values())
        for t, lv in res["levels"].items())]
    if res.get("timing"):
        tm = res["timing"]
        lines += ["", f"Step time, RAPT vs plain prompt tuning (same rows, batch "
                      f"{tm['batch_size']}, rows ≤ {tm['row_length_max']} tokens, |T| = "
                      f"{tm['rec_vocab_size']}, {tm['plain_len']} plain positions; "
                      f"{tm['pairs']} step pairs interleaved): median step "
                      f"{tm['rapt_step_s']:.2f} s vs {tm['plain_step_s']:.2f} s; median "
                      f"per-pair ratio **{tm['ratio']:.3f}** (IQR {tm['ratio_p25_p75'][0]:.2f}–"
                      f"{tm['ratio_p25_p75'][1]:.2f}; goal ≤ 1.15)."]
    if res.get("attack"):
        lines += ["", "Attribute inference (TrustPilot split b, prefix tuning; empirical privacy"
                      " = 1 − attack accuracy; majority = always guessing the majority class):",
                  "", "| setting | P | attribute | features | attack acc | emp. privacy | "
                      "majority |", "|---|---|---|---|---|---|---|"]
        for a in res["attack"]:
            lines.append(f"| {a['setting']} | {a['P']} | {a['attribute']} | {a['feature']} | "
                         f"{a['accuracy']:.3f} | {a['empirical_privacy']:.3f} | "
                         f"{a['majority_rate']:.3f} |")
    m = res["machine"]
    lines += ["", f"Machine: {m['platform']}, {m['cpu_count']} CPUs, torch {m['torch']}, load "
                  f"average {m['loadavg_start'][0]:.1f} at start, "
                  f"{m.get('loadavg_end', [0])[0]:.1f} at end; {res.get('elapsed_s', 0) / 60:.1f}"
                  " min.", "", f"Command: `{res['command']}`"]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["settings"]
    summ = res.get("summary", [])
    fig, axes = plt.subplots(len(s["tasks"]), len(s["methods"]), squeeze=False,
                             figsize=(5 * len(s["methods"]), 3.6 * len(s["tasks"])))
    for i, task in enumerate(s["tasks"]):
        for j, method in enumerate(s["methods"]):
            ax = axes[i][j]
            for setting, color in (("+privatization", "#d62728"), ("+reconstruction", "#2ca02c")):
                pts = sorted((r["P"], r["mean"], r["std"]) for r in summ if r["task"] == task
                             and r["method"] == method and r["setting"] == setting)
                if pts:
                    ax.errorbar([p for p, _, _ in pts], [m for _, m, _ in pts],
                                yerr=[e for _, _, e in pts], marker="o", label=setting,
                                color=color, capsize=3)
            base = [r["mean"] for r in summ if r["task"] == task and r["method"] == method
                    and r["setting"] == "no privacy"]
            if base:
                ax.axhline(base[0], color="#777777", ls="--", label="no privacy")
            ax.set_title(f"{task}, {method} tuning")
            ax.set_xlabel("replacement probability P (more privacy →)")
            ax.set_ylabel("accuracy")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
