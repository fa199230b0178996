"""`rapt pate` (PromptPATE private prompt + Flocks Table 2 row) and `rapt mia` (membership
inference on prompts): thin layers over rapt.pate.pate, rapt.pate.gnmax and rapt.attacks.mia."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import typer

from rapt.cli._app import app, fail, load_backbone_or_fail

# Another task's inputs as out-of-distribution public data (Flocks used imdb for sst2, qqp for
# trec; the closest data here: TrustPilot reviews, and SST-2 sentences for TREC).
OOD_DEFAULT = {"sst2-sentences": "trustpilot", "sst2": "trustpilot", "trec": "sst2-sentences",
               "cb": "sst2-sentences"}
TEST_SPLIT = {"cb": "val"}  # cb's test split has no labels


def _load(name: str, split: str):
    from rapt.data import DataError, load_dataset

    try:
        return load_dataset(name, split)
    except (DataError, FileNotFoundError, ValueError) as e:
        fail(str(e))


def truncate_words(text: str, max_words: int) -> str:
    words = text.split()
    return " ".join(words[:max_words]) if max_words > 0 else text


def load_task(task: str, *, n_public: int, test_size: int, public: str, max_words: int,
              seed: int) -> dict:
    """Private pool, test set and public set(s) for ``task``, as plain demo tuples.

    IID public inputs are a random part of the task's train split, removed from the private pool
    (so no private example is also a public query); their labels are kept only for reporting.
    """
    from rapt.pate.pate import PublicSet, as_demos

    train = _load(task, "train")
    test = _load(task, TEST_SPLIT.get(task, "test"))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(train.examples))
    n_iid = n_public if public in ("iid", "both") else 0
    pub_ex = [train.examples[i] for i in order[:n_iid]]
    private = as_demos([train.examples[i] for i in order[n_iid:]])
    test_demos = as_demos(test.examples)
    if test_size and len(test_demos) > test_size:
        pick = np.random.default_rng(seed + 1).choice(len(test_demos), test_size, replace=False)
        test_demos = [test_demos[i] for i in sorted(pick)]
    publics = []
    if n_iid:
        publics.append(PublicSet(f"{task} (IID)", [(e.text, e.text_pair) for e in pub_ex],
                                 [int(e.label) for e in pub_ex]))
    if public not in ("iid", "none"):
        ood_name = OOD_DEFAULT.get(task, "") if public in ("ood", "both") else public
        if not ood_name:
            fail(f"no default OOD public data for task '{task}'; pass --public DATASET")
        ood = _load(ood_name, "train")
        pick = np.random.default_rng(seed + 2).permutation(len(ood.examples))[:n_public]
        # a pair template needs a pair: single-text public data fills both slots
        publics.append(PublicSet(f"{ood_name} (OOD)", [
            (truncate_words(ood.examples[i].text, max_words),
             ood.examples[i].text_pair or None) for i in pick]))
    return {"train": train, "private": private, "test": test_demos, "publics": publics,
            "label_names": train.label_names}


def _template(task: str, template: str | None, label_words: str | None, num_labels: int):
    from rapt.pate.pate import PateInputError, get_template

    try:
        t = get_template(template or task)
    except PateInputError as e:
        fail(str(e))
    if label_words:
        from dataclasses import replace

        words = tuple(w if w.startswith(" ") else " " + w for w in label_words.split(","))
        t = replace(t, label_words=words)
    if len(t.label_words) != num_labels:
        fail(f"template has {len(t.label_words)} label words but '{task}' has {num_labels} "
             "labels; pass --label-words")
    return t


def _scorer(backbone: str, words, batch_size: int):
    from rapt.pate.scorer import HFLabelScorer, LabelWordError
    bb = load_backbone_or_fail(backbone)
    if bb.kind != "causal":
        fail(f"backbone '{backbone}' is an encoder; PromptPATE needs a causal LM")
    try:
        return HFLabelScorer(bb, list(words), batch_size=batch_size)
    except LabelWordError as e:
        fail(f"--label-words: {e}")


def _write(obj: dict, out: Path | None) -> None:
    text = json.dumps(obj, indent=2)
    if out is None:
        typer.echo(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        typer.echo(f"wrote {out}", err=True)


@app.command()
def pate(
    task: str = typer.Option("sst2-sentences", help="private task: sst2-sentences, trec, cb"),
    public: str = typer.Option("both", help="iid | ood | both | a dataset name (OOD inputs)"),
    teachers: int = typer.Option(20, min=1, help="teacher prompts (disjoint private shots)"),
    shots: int = typer.Option(1, min=1, help="private demonstrations per teacher"),
    queries: int = typer.Option(100, min=0, help="public inputs per public set"),
    test_size: int = typer.Option(200, min=0, help="test examples (0 = whole split)"),
    threshold: float | None = typer.Option(None, help="T (default 0.9 x teachers, Flocks 180/200)"),
    sigma1: float = typer.Option(1.0, help="threshold noise σ1"),
    sigma2: float | None = typer.Option(None, help="GNMax noise σ2 (default teachers/10)"),
    delta: float = typer.Option(1e-6, help="δ of the reported (ε, δ)"),
    budget: float | None = typer.Option(None, help="stop labelling before ε exceeds this"),
    candidates: int = typer.Option(10, min=1, help="student candidate prompts"),
    max_val: int = typer.Option(40, min=1, help="max held-out released pairs for selection"),
    backbone: str = typer.Option("smollm2-135m", help="causal LM name or path"),
    template: str | None = typer.Option(None, help="built-in template (default: task)"),
    label_words: str | None = typer.Option(None, help="comma-separated label words"),
    max_words: int = typer.Option(40, help="truncate OOD public texts to this many words"),
    batch_size: int = typer.Option(32, min=1, help="queries per forward pass"),
    no_calibration: bool = typer.Option(False, "--no-calibration",
                                        help="skip contextual calibration"),
    top_token_only: bool = typer.Option(False, help="teachers vote with the top next token only"),
    no_baselines: bool = typer.Option(False, "--no-baselines",
                                      help="skip zero-shot / ensemble / best-private"),
    seed: int = typer.Option(0, help="data splits only: public/test picks, teacher partition, "
                                     "student candidates (not the GNMax noise)"),
    noise_seed: int | None = typer.Option(
        None, help="seed the GNMax vote noise: repeatable but NOT private (report marked "
                   "seeded: true); default: OS entropy"),
    out: Path | None = typer.Option(None, help="write the JSON report here (default stdout)"),
) -> None:
    """PromptPATE: teachers vote on public inputs, Confident-GNMax labels them, a student prompt
    is selected. The report keeps the private release (student prompts, ε composed over every
    release from the same teachers, δ) apart from diagnostics that are not covered by ε."""
    from rapt.pate.gnmax import GNMaxConfig
    from rapt.pate.pate import SEEDED_WARNING, PateInputError, pate_experiment, validate_inputs
    from rapt.progress import progress_bar

    if queries < 1 and public != "none":
        fail("--queries must be >= 1: the public set is empty")
    if noise_seed is not None:
        typer.echo(SEEDED_WARNING, err=True)
    data = load_task(task, n_public=queries, test_size=test_size, public=public,
                     max_words=max_words, seed=seed)
    t = _template(task, template, label_words, len(data["label_names"]))
    try:
        if not data["publics"]:
            raise PateInputError("no public set: use --public iid, ood, both or a dataset name")
        for pub in data["publics"]:
            validate_inputs(len(data["private"]), teachers, shots, len(pub.inputs))
        cfg = GNMaxConfig(threshold=threshold if threshold is not None else 0.9 * teachers,
                          sigma1=sigma1, sigma2=sigma2 if sigma2 is not None else teachers / 10,
                          delta=delta, epsilon_budget=budget)
    except (PateInputError, ValueError) as e:
        fail(str(e))
    scorer = _scorer(backbone, t.label_words, batch_size)
    cal = int(not no_calibration)
    n_test = len(data["test"]) + cal
    total = sum(teachers * (len(p.inputs) + cal) + candidates * (max_val + cal) + n_test
                for p in data["publics"]) + (0 if no_baselines else 2 * n_test)
    with progress_bar(total=total, desc="pate", unit="vote") as bar:
        res = pate_experiment(scorer, t, data["private"], data["test"], data["publics"], cfg,
                              n_teachers=teachers, shots=shots, calibrated=not no_calibration,
                              n_candidates=candidates, max_val=max_val, seed=seed,
                              noise_seed=noise_seed, baselines=not no_baselines,
                              top_token_only=top_token_only, progress=bar.update)
    res.update({"task": task, "backbone": backbone, "delta": delta, "threshold": cfg.threshold,
                "sigma1": cfg.sigma1, "sigma2": cfg.sigma2, "budget": budget,
                "data_dependent_epsilon": cfg.data_dependent, "private_pool": len(data["private"]),
                "top_token_only": top_token_only, "seed": seed, "noise_seed": noise_seed,
                "label_words": list(t.label_words), "command": " ".join(sys.argv)})
    _write(res, out)
    typer.echo(epsilon_summary(res["private_release"]), err=True)


def epsilon_summary(rel: dict) -> str:
    """The privacy lines printed after `rapt pate` (stderr)."""
    n = rel["releases_composed"]
    lines = [
        f"PromptPATE: {n} release{'s' if n != 1 else ''} from the same {rel['teachers']} "
        f"teachers, composed, at δ = {rel['delta']:g}:",
        f"  ε (data-dependent)   = {rel['epsilon']:.4g}  -- computed from the private votes: "
        "publishing this number is itself not private (smooth sensitivity not implemented)",
        f"  ε (data-independent) = {rel['epsilon_data_independent']:.4g}  -- depends only on "
        "σ1, σ2 and the numbers of queries processed and answered",
        "  'diagnostics_not_private' (ε curves, consensus, teacher indices, baselines) is not "
        "covered by ε.",
    ]
    if rel["seeded"]:
        lines.append("  SEEDED noise: this run gives no privacy guarantee.")
    return "\n".join(lines)


@app.command()
def mia(
    task: str = typer.Option("sst2-sentences", help="private task: sst2-sentences, trec, cb"),
    prompts: int = typer.Option(100, min=1, help="prompts attacked (Flocks: 100)"),
    shots: int = typer.Option(1, min=1, help="demonstrations (members) per prompt"),
    nonmembers: int = typer.Option(50, min=1, help="non-member candidates per prompt"),
    normalized: bool = typer.Option(False, help="score with P renormalized over label words"),
    backbone: str = typer.Option("smollm2-135m", help="causal LM name or path"),
    template: str | None = typer.Option(None, help="built-in template (default: task)"),
    label_words: str | None = typer.Option(None, help="comma-separated label words"),
    batch_size: int = typer.Option(32, min=1),
    seed: int = typer.Option(0),
    out: Path | None = typer.Option(None, help="write the JSON report here (default stdout)"),
) -> None:
    """Membership inference on k-shot prompts: AUC of P(true label) for members vs non-members."""
    from rapt.attacks.mia import mean_roc, prompt_mia
    from rapt.pate.pate import as_demos
    from rapt.progress import progress_bar

    train = _load(task, "train")
    private = as_demos(train.examples)
    if len(private) < shots + nonmembers:
        fail(f"{task}: {len(private)} examples cannot give {shots} members and {nonmembers} "
             "non-members per prompt")
    t = _template(task, template, label_words, len(train.label_names))
    scorer = _scorer(backbone, t.label_words, batch_size)
    with progress_bar(total=prompts * (shots + nonmembers), desc="mia", unit="vote",
                      file=sys.stderr) as bar:
        res = prompt_mia(scorer, t, private, n_prompts=prompts, shots=shots,
                         n_nonmembers=nonmembers, seed=seed, normalized=normalized,
                         progress=bar.update)
    fpr, tpr = mean_roc(res.curves())
    report = {"task": task, "backbone": backbone, "shots": shots, "nonmembers": nonmembers,
              **res.summary(), "mean_roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()},
              "command": " ".join(sys.argv)}
    _write(report, out)
