"""Label inference from ∂l/∂g (rapt.attacks.label_inference) and its mitigation, label DP by
randomized response (rapt.dp.label_dp, SplitConfig.label_dp_epsilon): issue 28 item 4."""

from __future__ import annotations

import math

import pytest
import torch

from rapt.attacks.label_inference import (
    estimate_num_classes,
    gradient_rank,
    infer_labels,
    label_inference_attack,
    score_clusters,
)
from rapt.dp.label_dp import keep_probability, randomized_response
from rapt.noise import NoiseSource


def _ce_grads(W: torch.Tensor, g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∂/∂g of mean cross-entropy(g Wᵀ, y): what the customer returns."""
    g = g.clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(g @ W.T, y).backward()
    return g.grad


@pytest.mark.parametrize("classes", [2, 3, 5])
def test_gradients_reveal_the_classes_and_group_the_rows(classes):
    gen = torch.Generator().manual_seed(classes)
    W = torch.randn(classes, 24, generator=gen)
    batches, labels = [], []
    for _ in range(12):
        W = W + 0.05 * torch.randn(W.shape, generator=gen)  # the customer's head trains
        y = torch.randint(classes, (32,), generator=gen)
        batches.append(_ce_grads(W, torch.randn(32, 24, generator=gen), y))
        labels.append(y)
    assert max(gradient_rank(b) for b in batches) == classes - 1
    assert estimate_num_classes(batches) == classes
    res = label_inference_attack(batches, labels, num_classes=classes)
    assert res.num_classes_inferred == classes and res.n == 12 * 32
    # two or three classes: the cones are far apart and the clustering is exact; with five,
    # spherical k-means cuts a few rows near a thin cone's edge into its neighbour
    assert res.accuracy >= (1.0 if classes <= 3 else 0.97)
    # a control the attack cannot win: gradients that do not depend on the labels
    blind = [torch.randn(32, 24, generator=gen) for _ in batches]
    clusters, k = infer_labels(blind, k=classes)
    assert score_clusters(torch.cat(clusters), torch.cat(labels))[1] < 0.8
    assert estimate_num_classes(blind) == 25  # full rank: the class count is hidden


def test_score_clusters_purity_and_best_naming():
    clusters = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    labels = torch.tensor([1, 1, 0, 2, 2, 0, 0, 0])
    purity, acc = score_clusters(clusters, labels)
    assert purity == pytest.approx(7 / 8) and acc == pytest.approx(7 / 8)
    # two clusters of one label: pure, but a one-to-one naming gets only one of them
    purity, acc = score_clusters(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 0, 0]))
    assert purity == 1.0 and acc == 0.5
    with pytest.raises(ValueError, match="one cluster per label"):
        score_clusters(torch.tensor([0, 1]), torch.tensor([0]))


def test_randomized_response_is_epsilon_label_dp():
    eps, C, n = 1.0, 3, 60_000
    p = keep_probability(eps, C)
    assert p == pytest.approx(math.e / (math.e + 2))
    y = torch.zeros(n, dtype=torch.long)
    out = randomized_response(y, C, eps, NoiseSource(0))
    freq = torch.bincount(out, minlength=C).double() / n
    tol = 4 * math.sqrt(p * (1 - p) / n)
    assert abs(float(freq[0]) - p) < tol
    assert abs(float(freq[1]) - (1 - p) / 2) < tol and abs(float(freq[2]) - (1 - p) / 2) < tol
    # the largest probability ratio between two inputs is e^ε (here 0 vs 1 for output 0)
    out1 = randomized_response(torch.ones(n, dtype=torch.long), C, eps, NoiseSource(1))
    ratio = float(freq[0]) / float((out1 == 0).double().mean())
    assert abs(math.log(ratio) - eps) < 0.1
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="ε"):
            keep_probability(bad, C)
    with pytest.raises(ValueError, match="labels"):
        randomized_response(torch.tensor([3]), C, eps)


def _toy(tiny_tokenizer, **kw):
    from rapt.split import SplitConfig, encode_texts, setup_split
    from tests._tiny import WORDS, make_bert

    bb = make_bert(tiny_tokenizer)
    gen = torch.Generator().manual_seed(0)
    texts = [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (6,), generator=gen))
             for _ in range(96)]
    rows = encode_texts(bb.tokenizer, texts, 12)
    labels = [i % 3 for i in range(len(rows))]
    cfg = SplitConfig(**{"split_layer": 1, "eta": 50.0, "noise_seed": 2, "batch_size": 16,
                         "epochs": 2, "lr": 1e-2, **kw})
    customer, provider = setup_split(bb, cfg, 3, len(rows))
    customer.load(rows, labels)
    return customer, provider, labels


def _attack(customer, provider, labels):
    from rapt.split import train_split

    grads, truth = [], []

    def observe_grad(idx, msg):  # what the provider receives, and (for scoring) whose rows
        grads.append(msg.grad)
        truth.append(torch.tensor([labels[i] for i in idx]))

    train_split(customer, provider, observe_grad=observe_grad)
    return label_inference_attack(grads, truth, num_classes=3)


def test_the_provider_recovers_split_labels_and_label_dp_bounds_it(tiny_tokenizer):
    customer, provider, labels = _toy(tiny_tokenizer)
    plain = _attack(customer, provider, labels)
    assert plain.num_classes_inferred == 3 and plain.accuracy == 1.0
    eps = 1.0
    customer, provider, labels = _toy(tiny_tokenizer, label_dp_epsilon=eps)
    trained = customer._labels
    kept = float((trained == torch.tensor(labels)).double().mean())
    assert 0.4 < kept < 0.8  # p = 0.58 at ε 1, C 3 (96 rows)
    dp = _attack(customer, provider, labels)
    # the gradients still follow the labels they were computed from (the randomized ones) ...
    assert dp.num_classes_inferred == 3
    # ... so what the provider learns about the true labels is what randomized response let by
    assert dp.accuracy <= kept + 0.05


def test_label_dp_config_and_resume(tiny_tokenizer):
    from rapt.split import SplitConfig

    for kw, word in [(dict(label_dp_epsilon=0.0), "label_dp_epsilon"),
                     (dict(label_dp_epsilon=math.inf), "label_dp_epsilon"),
                     (dict(label_dp_epsilon=1.0, eta=5.0, cti=True), "cti")]:
        with pytest.raises(ValueError, match=word):
            SplitConfig(**kw)
    assert "label_dp_epsilon" not in SplitConfig().provider_view()
    customer, _, labels = _toy(tiny_tokenizer, label_dp_epsilon=1.0)
    state = customer.state_dict()
    other, _, _ = _toy(tiny_tokenizer, label_dp_epsilon=1.0, noise_seed=77)
    assert not torch.equal(other._labels, customer._labels)  # another draw
    other.load_state_dict(state)
    assert torch.equal(other._labels, customer._labels)  # resume trains on the same draw
    with pytest.raises(ValueError, match="randomized labels"):
        other.load_state_dict({**state, "trained_labels": None})


def test_sap_attack_labels_reports_the_leak_and_the_mitigation(tmp_path, tiny_tokenizer):
    import json

    from typer.testing import CliRunner

    from rapt.cli import app
    from tests._tiny import WORDS, make_bert, save_backbone

    model = save_backbone(make_bert(tiny_tokenizer, max_positions=64), tmp_path / "bb")
    gen = torch.Generator().manual_seed(0)
    lines = ["text,label"] + [
        " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (5,), generator=gen))
        + f",{'abc'[k % 3]}" for k in range(48)]
    csv = tmp_path / "d.csv"
    csv.write_text("\n".join(lines) + "\n")
    base = ["sap", "attack", str(csv), "--backbone", str(model), "--labels", "--split-layer",
            "1", "--eta", "50", "--noise-seed", "1", "--epochs", "2", "--limit", "48"]
    out = {}
    for extra in ([], ["--label-dp-epsilon", "0.5"]):
        r = CliRunner().invoke(app, base + extra)
        assert r.exit_code == 0, r.output
        out[bool(extra)] = json.loads(r.stdout[r.stdout.rindex('{"attack"'):].splitlines()[0])
    assert out[False]["num_classes_inferred"] == out[False]["num_classes"] == 3
    assert out[False]["accuracy"] == 1.0 and out[False]["steps"] == 4
    assert out[True]["label_dp_epsilon"] == 0.5 and out[True]["accuracy"] < 0.8
