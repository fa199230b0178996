"""Channel remedies (issue 27: a, b, c) against +privatization, prefix tuning at P ≈ 0.4.

The regime is ``rapt demo``'s (:class:`rapt.demo.DemoConfig`: MiniLM, 800 training / 500 test
sentences, frozen label-description head, 10 virtual tokens, 2 epochs at batch 8), on 5 paired
seeds: seed s fixes the prefix init, the data order and the privacy noise (noise seed
``1000 + s``), so every setting of a seed sees the same privatized text. Settings:

* ``no privacy``: clean rows, clean queries;
* ``+privatization``: rows and queries privatized at η (calibrated for P on public text);
* ``+denoise-then-tune``: the same privatized rows and queries, read back by a saved
  :class:`rapt.channel.denoiser.Denoiser` (trained on public text only, by
  ``benchmarks/bench_channel_denoiser.py --save DIR``) before tuning and again at predict,
  through :class:`rapt.pipeline.Customization`'s ``channel``; the denoiser never sees originals;
* ``+privatized-MLM backbone`` (remedy c, after Qu et al.): rows and queries as released, the
  prompt tuned on the same denoiser's fine-tuned encoder (:meth:`Denoiser.adapted_backbone`);
* ``+channel adapter`` (remedy b, only with ``--adapter DIR``): rows and queries as released,
  the prompt tuned on the backbone with a LoRA distilled on public (clean, privatized) pairs
  (:class:`rapt.channel.adapter.ChannelAdapter`, ``benchmarks/bench_channel_adapter.py``).

Controls (no extra tuning, the ``+privatization`` prompt re-scored): ``+privatization, clean
queries`` and ``+privatization, denoised queries``.

Attacks on the first seed's privatized test queries: ``nearest neighbour``, ``bayes``
(mechanism-aware, public unigram prior) and ``denoiser`` (the same channel model).

Writes benchmarks/results/channel.{json,md,png} (``--quick``: channel_quick.*). Resumable: each
run is appended to the JSON as it finishes and a rerun skips the runs already there.

    python -m benchmarks.bench_channel --denoiser /tmp/channel/minilm-p0.4-sst2 [--seeds 5]
        [--adapter DIR] [--task sst2|financial_phrasebank] [--device cuda] [--threads 2]
        [--quick]

The denoiser and the adapter must come from public text disjoint from ``--task``
(:func:`rapt.channel.corpus.check_disjoint`).
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks._common import RESULTS, command, machine, machine_of
from rapt.demo import DemoConfig, _accuracy, _demo_data, _text_length, _tune_config
from rapt.stats import effect_word, gap_won_back, mean_ci, paired_difference

TASK, METHOD = "sst2", "prefix"
DATASETS = {"sst2": "sst2-sentences", "financial_phrasebank": "financial_phrasebank"}
REMEDIES = ("+denoise-then-tune", "+privatized-MLM backbone", "+channel adapter")
SETTINGS = ("no privacy", "+privatization", *REMEDIES)
CONTROLS = ("+privatization, clean queries", "+privatization, denoised queries")
# The no-privacy prompt scored on the privatized queries, and on them with every replaced token
# masked: an oracle (it knows which tokens the mechanism replaced, which no remedy can), the
# ceiling of a remedy that could only drop the replaced words.
CLEAN_PROMPT_CONTROLS = ("no-privacy prompt, privatized queries",
                         "no-privacy prompt, replaced tokens masked (oracle)")
ALL_CONTROLS = (*CONTROLS, *CLEAN_PROMPT_CONTROLS)
NOISE_SEED0 = 1000


# What the runs did before a DemoConfig field existed: results without the field were made so.
BEFORE_FIELD = {"precision": "fp32"}


def _same_regime(had: dict, now: dict) -> bool:
    """Whether stored results were made in the regime ``now``: a DemoConfig field added since
    (absent from ``had``) counts as the same when it holds the value that reproduces the old
    behaviour (:data:`BEFORE_FIELD`)."""
    old, new = had.get("demo_config") or {}, dict(now["demo_config"])
    for k in [k for k in new if k not in old and k in BEFORE_FIELD
              and new[k] == BEFORE_FIELD[k]]:
        del new[k]
    return old == new and all(had.get(k) == now[k] for k in now if k != "demo_config")


def _load(path: Path, header: dict) -> dict:
    """The results so far (resume) if they were made with the same regime, else a new doc."""
    if path.is_file():
        doc = json.loads(path.read_text())
        had = doc.get("regime") or {}
        if _same_regime(had, header["regime"]):
            return doc
        # Never overwrite finished runs of another regime: they may be committed results.
        diff = [k for k in header["regime"] if had.get(k) != header["regime"][k]]
        raise SystemExit(f"{path} holds runs of another regime (differs in {diff}); give "
                         "another --out, or move it away to start over")
    return {**header, "runs": [], "attacks": [], "history": []}


def _save(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def _done(doc: dict, setting: str, seed: int) -> bool:
    return any(r["setting"] == setting and r["seed"] == seed for r in doc["runs"])


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--denoiser", default=None,
                    help="folder of a saved Denoiser: adds (a), (c), the denoised-queries "
                         "control and the denoiser attacker")
    ap.add_argument("--method", default=METHOD, choices=["prefix", "lora"],
                    help="the customer's tuning method on top of each setting")
    ap.add_argument("--settings", default=None,
                    help="comma-separated subset of the settings and controls to run "
                         "(default: every one the given channel models allow)")
    ap.add_argument("--adapter", default=None,
                    help="folder of a saved rapt.channel.adapter.ChannelAdapter: adds the "
                         "'+channel adapter' setting (remedy b)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--target-p", type=float, default=0.4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backbone", default="minilm",
                    help="name or local folder (the device machine's carried float16 copy); "
                         "loaded in float32")
    ap.add_argument("--task", default=TASK, choices=sorted(DATASETS))
    ap.add_argument("--out", default=None,
                    help="output stem (default benchmarks/results/channel[_quick])")
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script")
    ap.add_argument("--notes", default=None,
                    help="file whose text goes into the JSON and the md (the reading of the "
                         "numbers; kept across reruns)")
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared

    from rapt.attacks.recovery import ReconstructionInput, run_attackers
    from rapt.channel.corpus import check_disjoint, public_corpus_for
    from rapt.channel.denoiser import Denoiser
    from rapt.models import load_backbone
    from rapt.pipeline import Customization, Encoding
    from rapt.privacy.mechanism import calibrate_eta_public, replacement_probability
    from rapt.tuning.tune import TuneConfig

    # fp32 pinned: every committed channel result was measured so (DemoConfig's default moves).
    cfg = DemoConfig(backbone=args.backbone, dataset=DATASETS[args.task],
                     target_p=args.target_p, seeds=args.seeds, method=args.method,
                     precision="fp32")
    if args.quick:
        cfg = replace(cfg, train_size=48, test_size=40, epochs=1, seeds=min(args.seeds, 2))
    stem = Path(args.out) if args.out else RESULTS / ("channel_quick" if args.quick
                                                      else "channel")
    path = Path(f"{stem}.json")  # not with_suffix: a stem like "p0.4" has a dot of its own
    path.parent.mkdir(parents=True, exist_ok=True)
    bb = load_backbone(cfg.backbone, device=args.device)  # float32, also from a float16 copy
    den = Denoiser.load(args.denoiser, bb) if args.denoiser else None
    if den is not None and not args.quick:
        check_disjoint(den.meta.get("corpus") or {}, args.task)
    eta = calibrate_eta_public(bb, cfg.target_p)
    doc, header, adapter = _open_doc(args, cfg, bb, den, eta, path)
    session = {"command": header["command"], "load_start": os.getloadavg(),
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    t_start = time.perf_counter()

    train, test = _demo_data(cfg, print)
    base = _tune_options(cfg, bb, train, test, doc)
    enc = Encoding(max_length=base["max_length"])
    P = cfg.target_p

    def record(setting: str, seed: int, acc: float, seconds: float, **extra) -> None:
        doc["runs"].append({"task": args.task, "method": cfg.method, "setting": setting, "P": P,
                            "seed": seed, "accuracy": acc, "seconds": round(seconds, 1),
                            **extra})
        _save(path, doc)
        print(f"seed {seed}: {setting:34s} accuracy {acc:.3f} ({seconds:.0f} s)", flush=True)

    wanted = _wanted(args.settings, den is not None, adapter is not None)
    for seed in range(cfg.seed, cfg.seed + cfg.seeds):
        todo = [s for s in wanted if not _done(doc, s, seed)]
        if not todo and (seed != cfg.seed or doc["attacks"]):
            continue
        custom = Customization.create(bb, enc, eta=eta, noise_seed=NOISE_SEED0 + seed,
                                      privatizer_mode=cfg.privatizer_mode)
        rows, q = custom.rows(train.texts), custom.rows(test.texts, queries=True)
        priv, priv_q = custom.privatize(rows, measure=False), custom.privatize(q, measure=False)
        p_meas = replacement_probability(rows, priv, bb.special_ids)
        tcfg = TuneConfig(**base, seed=seed)
        remedy = replace(custom, config=tcfg, channel=den)
        if seed == cfg.seed and not doc["attacks"]:
            doc["attacks"] = _attacks(bb, custom, den, q, priv_q, eta, P,
                                      ReconstructionInput, run_attackers, public_corpus_for,
                                      quick=args.quick, task=args.task)
            _save(path, doc)
        plain = replace(custom, config=tcfg, privatizer=None)
        private = replace(custom, config=tcfg)
        d = _SeedRows(rows, priv, q, priv_q, p_meas, train, test)
        _run_clean(todo, record, seed, plain, d, bb.tokenizer)
        _run_private(todo, record, seed, private, remedy, d)
        _run_remedies(todo, record, seed, private, remedy, d, (bb, den, adapter))

    session.update(load_end=os.getloadavg(), wall_s=round(time.perf_counter() - t_start, 1))
    doc["history"].append(session)
    doc["summary"] = summarize(doc)
    _save(path, doc)
    Path(f"{stem}.md").write_text(markdown(doc))
    plot(doc, Path(f"{stem}.png"))
    print(markdown(doc))


def _tune_options(cfg, bb, train, test, doc: dict) -> dict:
    """TuneConfig's fields shared by every setting; the text length they truncate at (and the
    data's sizes) go into the document's regime."""
    from rapt.config import default_lr

    base = _tune_config(cfg, bb, list(train.label_names))  # the demo's head resolution
    head_kw = {"head": base.head, "label_descriptions": base.label_descriptions,
               "label_words": base.label_words}
    n_text, whole = _text_length(cfg, bb.tokenizer, train.texts, print)
    doc["regime"]["text_length"], doc["regime"]["rows_whole"] = n_text, whole
    doc["regime"]["n_train"], doc["regime"]["n_test"] = len(train), len(test)
    lr = cfg.lr if cfg.lr is not None else default_lr(cfg.method)
    return dict(method=cfg.method, num_virtual_tokens=cfg.num_virtual_tokens, lr=lr,
                epochs=cfg.epochs, batch_size=cfg.batch_size, max_length=n_text, **head_kw)


def _open_doc(args, cfg, bb, den, eta: float, path: Path) -> tuple[dict, dict, object]:
    """The results document (resumed from ``path`` when its regime is the same), its header,
    and the channel adapter when one is given (kept outside the regime)."""
    regime = {"demo_config": asdict(cfg), "eta": eta, "noise_seed0": NOISE_SEED0,
              "denoiser": den and {"folder": args.denoiser, "config": asdict(den.config),
                                   "meta": den.meta}}
    header = {"command": command(),
              "machine": machine(**({"gpu": torch.cuda.get_device_name()}
                                    if args.device == "cuda" else {})), "regime": regime}
    doc = _load(path, json.loads(json.dumps(header, default=str)))
    adapter = None
    if args.adapter:  # kept outside the regime, so adding it resumes the other settings
        from rapt.channel.adapter import ChannelAdapter
        from rapt.channel.corpus import check_disjoint

        adapter = ChannelAdapter.load(args.adapter, bb)
        if not args.quick:
            check_disjoint(adapter.meta.get("corpus") or {}, args.task)
        doc["adapter"] = json.loads(json.dumps(
            {"folder": args.adapter, "config": asdict(adapter.config), "meta": adapter.meta},
            default=str))
    if args.notes:
        doc["notes"] = Path(args.notes).read_text().strip()
    return doc, header, adapter


@dataclass(frozen=True)
class _SeedRows:
    """One seed's rows: training rows and test queries, clean and privatized, with the
    measured replacement probability and the data they came from."""

    rows: list
    priv: list
    q: list
    priv_q: list
    p_meas: float
    train: object
    test: object


def _run_clean(todo: list[str], record, seed: int, plain, d: _SeedRows, tokenizer) -> None:
    """No privacy, and the prompt tuned on clean rows read on privatized queries."""
    if not {"no privacy", *CLEAN_PROMPT_CONTROLS} & set(todo):
        return
    train, test = d.train, d.test
    t = time.perf_counter()
    plain.tune(d.rows, train.labels, len(train.label_names))
    if "no privacy" in todo:
        record("no privacy", seed, _accuracy(plain.predict(d.q), test.labels),
               time.perf_counter() - t, P_measured=0.0)
    for name, queries in zip(CLEAN_PROMPT_CONTROLS,
                             (d.priv_q, _mask_replaced(d.q, d.priv_q, tokenizer)),
                             strict=True):
        if name in todo:
            t = time.perf_counter()
            record(name, seed, _accuracy(plain.predict(queries), test.labels),
                   time.perf_counter() - t, P_measured=d.p_meas, control=True)


def _run_private(todo: list[str], record, seed: int, private, remedy, d: _SeedRows) -> None:
    """+privatization, and its prompt read on clean and on denoised queries."""
    if not {"+privatization", *CONTROLS} & set(todo):
        return
    train, test, p_meas = d.train, d.test, d.p_meas
    t = time.perf_counter()
    private.tune(d.priv, train.labels, len(train.label_names))
    if "+privatization" in todo:
        record("+privatization", seed, _accuracy(private.predict(d.priv_q), test.labels),
               time.perf_counter() - t, P_measured=p_meas)
    t = time.perf_counter()
    if CONTROLS[0] in todo:
        record(CONTROLS[0], seed, _accuracy(private.predict(d.q), test.labels),
               time.perf_counter() - t, P_measured=p_meas, control=True)
    t = time.perf_counter()
    if CONTROLS[1] in todo:
        den_q = remedy.denoise(d.priv_q)
        record(CONTROLS[1], seed, _accuracy(private.predict(den_q), test.labels),
               time.perf_counter() - t, P_measured=p_meas, control=True)


def _run_remedies(todo: list[str], record, seed: int, private, remedy, d: _SeedRows,
                  models: tuple) -> None:
    """The remedies: denoise-then-tune (a), the channel adapter (b) and the privatized-MLM
    backbone (c)."""
    bb, den, adapter = models
    train, test, p_meas, priv, priv_q = d.train, d.test, d.p_meas, d.priv, d.priv_q
    if "+denoise-then-tune" in todo:
        t = time.perf_counter()
        remedy.tune(priv, train.labels, len(train.label_names))
        record("+denoise-then-tune", seed, _accuracy(remedy.predict(priv_q), test.labels),
               time.perf_counter() - t, P_measured=p_meas)
    if "+privatized-MLM backbone" in todo:
        # Remedy (c): rows and queries as released, read by the denoiser's encoder; the
        # privatizer stays the public backbone's (priv, priv_q were made above).
        t = time.perf_counter()
        adapted = replace(private, backbone=den.adapted_backbone(bb), artifact=None)
        adapted.tune(priv, train.labels, len(train.label_names))
        record("+privatized-MLM backbone", seed,
               _accuracy(adapted.predict(priv_q), test.labels), time.perf_counter() - t,
               P_measured=p_meas)
    if "+channel adapter" in todo:
        # Remedy (b): the backbone with the distilled LoRA merged in, rows as released.
        t = time.perf_counter()
        adapted = replace(private, backbone=adapter.adapted_backbone(bb), artifact=None)
        adapted.tune(priv, train.labels, len(train.label_names))
        record("+channel adapter", seed, _accuracy(adapted.predict(priv_q), test.labels),
               time.perf_counter() - t, P_measured=p_meas)


def _wanted(chosen: str | None, has_denoiser: bool, has_adapter: bool) -> list[str]:
    """The settings and controls to run: ``chosen`` (comma-separated) or every one the
    channel models allow; a named setting whose model is missing is an error."""
    needs = {"+denoise-then-tune": has_denoiser, "+privatized-MLM backbone": has_denoiser,
             CONTROLS[1]: has_denoiser, "+channel adapter": has_adapter}
    every = (*SETTINGS, *ALL_CONTROLS)
    if chosen is None:
        return [s for s in every if needs.get(s, True)]
    names = _split_settings(chosen, every)
    for n in names:
        if n not in every:
            raise SystemExit(f"--settings: unknown setting {n!r}; choose from {list(every)}")
        if not needs.get(n, True):
            raise SystemExit(f"--settings: {n!r} needs " + (
                "--adapter" if n == "+channel adapter" else "--denoiser"))
    return names


def _mask_replaced(clean, private, tokenizer) -> list[list[int]]:
    """``private`` with every position the mechanism changed set to the mask token (an oracle:
    it reads the clean rows to know which)."""
    m = tokenizer.mask_token_id
    return [[m if a != b else b for a, b in zip(c, p, strict=True)]
            for c, p in zip(clean, private, strict=True)]


def _split_settings(chosen: str, every: tuple[str, ...]) -> list[str]:
    """``a;b`` or ``a,b``: setting names hold commas ("+privatization, clean queries"), so
    comma-split pieces that make a known name together are joined back."""
    if ";" in chosen:
        return [c.strip() for c in chosen.split(";") if c.strip()]
    names: list[str] = []
    for piece in (c.strip() for c in chosen.split(",") if c.strip()):
        if names and f"{names[-1]}, {piece}" in every:
            names[-1] = f"{names[-1]}, {piece}"
        else:
            names.append(piece)
    return names


def _attacks(bb, custom, den, clean_q, priv_q, eta, P, ReconstructionInput, run_attackers,
             public_corpus_for, *, quick: bool, task: str = TASK) -> list[dict]:
    """Token recovery of each attacker on the privatized test queries' text positions."""
    tok = bb.tokenizer
    special = tuple(int(i) for i in bb.special_ids)
    strip = [[t for t in r if t not in special] for r in clean_q]
    pstrip = [[t for t in r if t not in special] for r in priv_q]
    public = public_corpus_for(task, max_rows_per_source=200 if quick else 2000, seed=0)
    pub_rows = [list(r) for r in public.tokenize(tok).rows]
    priv = custom.privatizer
    inp = ReconstructionInput(pstrip, bb.embeddings.detach(), float(eta), special,
                              priv.candidate_ids, None, pub_rows, bb, 7,
                              {"denoiser": den, "bayes_samples": 16 if quick else 64})
    res = run_attackers(["nn", "bayes"] + (["denoiser"] if den is not None else []), inp, strip)
    names = {"nn": "nearest neighbour", "bayes": "bayes", "denoiser": "denoiser"}
    return [{"task": task, "backbone": bb.name, "P": P, "attacker": names[k],
             "recovery": v["all"], "recovery_replaced": v["replaced"], "n_tokens": v["n_all"],
             "n_replaced": v["n_replaced"], "on": "first seed's privatized test queries"}
            for k, v in res.items()]


def _acc(doc: dict, setting: str) -> dict[int, float]:
    return {r["seed"]: r["accuracy"] for r in doc["runs"] if r["setting"] == setting}


def _versus(rem_acc: dict[int, float], pri: dict[int, float], non: dict[int, float]) -> dict:
    """One remedy against +privatization over the seeds all three share: the paired
    difference, the gap, the share won back and the issue's goal."""
    seeds = sorted(set(rem_acc) & set(pri) & set(non))
    if len(seeds) < 2:
        return {}
    rem, p, x = ([d[k] for k in seeds] for d in (rem_acc, pri, non))
    won = gap_won_back(rem, p, x)
    diff, gap, share = won["diff"], won["gap"], won["share"]
    # Per seed: remedy − privatization − ½ (no privacy − privatization); > 0 = past halfway.
    half = paired_difference([r - 0.5 * (a - q) for r, a, q in zip(rem, x, p, strict=True)], p)
    return {"seeds": seeds, "remedy_minus_privatization": diff, "gap": gap,
            "share_won_back": share, "past_half": half,
            "goal_met": bool(share >= 0.5 and diff["excludes_zero"] and diff["mean_diff"] > 0),
            "effect": effect_word(diff)}


def summarize(doc: dict) -> dict:
    """Per-setting mean ± CI and, per remedy, the paired remedy − privatization difference,
    the share of the gap won back and the issue's goal (≥ half the gap, paired CI above 0)."""
    out: dict = {"settings": {}, "remedies": {}}
    for s in (*SETTINGS, *ALL_CONTROLS):
        acc = _acc(doc, s)
        if acc:
            m, ci = mean_ci(list(acc.values()))
            out["settings"][s] = {"mean": m, "ci95": ci, "n": len(acc)}
    non, pri = _acc(doc, "no privacy"), _acc(doc, "+privatization")
    for r in REMEDIES:
        v = _versus(_acc(doc, r), pri, non)
        if v:
            out["remedies"][r] = v
    return out


def _adapter_line(doc: dict) -> list[str]:
    a = doc.get("adapter")
    if not a:
        return []
    m = a["meta"]
    return ["", f"Channel adapter (b): `{a['folder']}` (LoRA r {a['config'].get('lora_r')}, "
            f"distilled on {m.get('rows', '?')} public (clean, privatized) pairs, "
            f"{m.get('steps', '?')} steps); merged into a copy of the backbone, rows as "
            "released."]


def _sizes(reg: dict, c: dict) -> str:
    if "n_test" in reg:
        return f"{reg['n_train']} training / {reg['n_test']} test sentences"
    return (f"{c['train_size']} training / at most {c['test_size']} test sentences (the test "
            "split's size if smaller)")


def _method_words(c: dict) -> str:
    if c["method"] == "prefix":
        return f"{c['num_virtual_tokens']} virtual tokens"
    return "LoRA at rapt's defaults"


def _denoiser_line(reg: dict, task: str) -> list[str]:
    d = reg.get("denoiser")
    if not d:
        return ["No denoiser in this run: (a), (c) and the denoised-queries control are not run."]
    dm = d["meta"]
    return [f"Denoiser: `{d['folder']}` (MiniLM, trained on {dm.get('rows', '?')} public "
            f"sentences disjoint from {task}, {dm.get('steps', '?')} steps; change margin "
            f"{d['config'].get('change_margin', 0):g}); (a) rows and queries pass through it; (c) "
            "its encoder (fine-tuned on the public pairs) is the backbone the prompt is tuned "
            "on, rows as released. It never sees originals."]


def markdown(doc: dict) -> str:
    s = doc.get("summary") or summarize(doc)
    reg = doc["regime"]
    c = reg["demo_config"]
    lines = ["# Channel remedies vs +privatization (issue 27: (a) denoise-then-tune, "
             "(b) channel adapter, (c) privatized-MLM backbone)", ""]
    for h in doc["history"]:
        lines.append(f"- `{h['command']}` started {h['started']}: {h['wall_s'] / 60:.1f} min "
                     f"wall; load {h['load_start'][0]:.1f} at start, {h['load_end'][0]:.1f} "
                     "at end.")
    m = machine_of(doc)
    where = (f"one {m['gpu']} GPU" if "gpu" in m else
             f"{m['cpu_count']} CPUs shared by several engineers, torch on {m['threads']} threads")
    task = "SST-2" if c["dataset"].startswith("sst2") else "Financial PhraseBank"
    lines += ["", f"Machine: {m['platform']}, {where}.", "",
              f"{task} ({c['dataset']}), {c['method']} tuning of {c['backbone']} in `rapt demo`'s "
              f"regime: {_sizes(reg, c)}, "
              f"{_method_words(c)}, {c['epochs']} epochs at batch "
              f"{c['batch_size']}, frozen label-description head, rows cut at "
              f"{reg.get('text_length')} tokens; η = {reg['eta']:.4g} (calibrated for P ≈ "
              f"{c['target_p']}). Seed s: same tuner init, data order and privatized text "
              f"(noise seed {reg['noise_seed0']} + s) in every setting.", "",
              *_denoiser_line(reg, task), *_adapter_line(doc), "",
              "| setting | accuracy (mean ± 95 % CI) | per seed |", "|---|---|---|"]
    for name in (*SETTINGS, *ALL_CONTROLS):
        acc = _acc(doc, name)
        if name in s["settings"]:
            r = s["settings"][name]
            per = ", ".join(f"{acc[k]:.3f}" for k in sorted(acc))
            tag = " (control)" if name in ALL_CONTROLS else ""
            lines.append(f"| {name}{tag} | {r['mean']:.3f} ± {r['ci95']:.3f} | {per} |")
    for name, v in s.get("remedies", {}).items():
        d, g, h = v["remedy_minus_privatization"], v["gap"], v["past_half"]
        lines += ["",
                  f"Paired over seeds {v['seeds']}: {name} − +privatization = "
                  f"{100 * d['mean_diff']:+.1f} ± {100 * d['ci95']:.1f} points (95 % CI); the "
                  f"privatization gap (no privacy − +privatization) is "
                  f"{100 * g['mean_diff']:.1f} ± {100 * g['ci95']:.1f} points; share of the gap "
                  f"won back: {v['share_won_back']:.0%}. Remedy − (privatization + half the "
                  f"gap), paired: {100 * h['mean_diff']:+.1f} ± {100 * h['ci95']:.1f} points. "
                  f"**Goal (≥ half the gap won back, paired 95 % CI above 0): "
                  f"{'met' if v['goal_met'] else 'not met'}**: {name} {v['effect']}."]
    lines.append("")
    if doc["attacks"]:
        lines += ["Attackers on the first seed's privatized test queries (text tokens only):",
                  "", "| attacker | recovery, all tokens | replaced tokens only |",
                  "|---|---|---|"]
        for a in doc["attacks"]:
            lines.append(f"| {a['attacker']} | {a['recovery']:.1%} | "
                         f"{a['recovery_replaced']:.1%} |")
        if reg.get("denoiser"):
            lines += ["", "The denoiser is the same channel model the remedy uses: where it "
                      "recovers more than nearest neighbour, the remedy's empirical privacy is "
                      "1 − its recovery, lower than the nearest-neighbour figure (the formal dχ "
                      "guarantee at η is unchanged: post-processing).", ""]
    if doc.get("notes"):
        lines += ["## Reading", "", doc["notes"], ""]
    return "\n".join(lines)


def plot(doc: dict, out: Path) -> None:
    """Accuracy per setting (bars: mean ± CI, dots: seeds) and attacker recovery."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2),
                                   gridspec_kw={"width_ratios": [2, 1]})
    names = [n for n in (*SETTINGS, *ALL_CONTROLS) if _acc(doc, n)]
    summ = doc["summary"]["settings"]
    colors = {"no privacy": "#999999", "+privatization": "#d62728",
              "+denoise-then-tune": "#2ca02c", "+privatized-MLM backbone": "#1f77b4",
              "+channel adapter": "#9467bd"}
    for j, n in enumerate(names):
        r = summ[n]
        ax1.bar(j, r["mean"], yerr=r["ci95"], capsize=4, color=colors.get(n, "#bbbbdd"))
        vals = list(_acc(doc, n).values())
        ax1.plot([j] * len(vals), vals, "k.", alpha=0.6)
        ax1.text(j, min(1.0, r["mean"] + r["ci95"] + 0.02), f"{r['mean']:.3f}", ha="center")
    ax1.set_xticks(range(len(names)), [textwrap.fill(n, 14) for n in names], fontsize=8)
    ax1.set_ylim(0.4, 1.0)
    ax1.set_ylabel(f"{doc['regime']['demo_config']['dataset']} test accuracy")
    s = doc["summary"]
    if s.get("remedies"):
        won = "; ".join(f"{k.lstrip('+')} {v['share_won_back']:.0%}"
                        for k, v in s["remedies"].items())
        ax1.set_title(f"P ≈ {doc['regime']['demo_config']['target_p']}: gap won back: {won} "
                      "(goal ≥ 50 %)", fontsize=10, pad=16)
    if doc["attacks"]:
        att = doc["attacks"]
        xs = range(len(att))
        ax2.bar([x - 0.2 for x in xs], [a["recovery"] for a in att], 0.4, label="all tokens")
        ax2.bar([x + 0.2 for x in xs], [a["recovery_replaced"] for a in att], 0.4,
                label="replaced only")
        ax2.set_xticks(list(xs), [a["attacker"] for a in att], fontsize=8)
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("token recovery")
        ax2.legend(fontsize=8)
        ax2.set_title("attackers on privatized queries", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
