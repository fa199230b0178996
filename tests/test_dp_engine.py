"""PromptDPSGD engine: broadcast per-example gradients, clipping, noise, coverage errors."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats
from torch import nn
from torch.nn import functional as F

from rapt.dp import DPSGD, DPConfig, epsilon

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a movie film good bad great awful boring fun plot actor story is was not very it "
    "this and but of music long fine").split()


class TinyPrompt(nn.Module):
    """Minimal soft-prompt classifier over a frozen BERT, implementing the broadcast protocol,
    with a task head on 2-D inputs and a reconstruction-style head on 3-D inputs."""

    def __init__(self, bert: nn.Module, n_prompt: int = 3, n_labels: int = 2,
                 rec_vocab: int = 7, m: int = 2) -> None:
        super().__init__()
        self.bert = bert
        for p in self.bert.parameters():
            p.requires_grad_(False)
        d = bert.config.hidden_size
        g = torch.Generator().manual_seed(1)
        self.prompt = nn.Parameter(torch.randn(n_prompt, d, generator=g) * 0.5)
        self.head = nn.Linear(d, n_labels)
        self.rec = nn.Linear(d, rec_vocab)
        self.m = m
        self._pe: list[tuple[nn.Parameter, torch.Tensor]] = []

    def per_example_tensors(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        return self._pe

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n = ids.shape[0], self.prompt.shape[0]
        e = self.prompt.unsqueeze(0).expand(b, -1, -1)
        if e.requires_grad:
            e.retain_grad()
        self._pe = [(self.prompt, e)]
        x = torch.cat([e, self.bert.get_input_embeddings()(ids)], 1)
        am = torch.cat([torch.ones(b, n, dtype=mask.dtype), mask], 1)
        h = self.bert(inputs_embeds=x, attention_mask=am).last_hidden_state
        return self.head(h[:, n]), self.rec(h[:, n + 1:n + 1 + self.m])

    def per_example_loss(self, ids, mask, y, rec_y) -> torch.Tensor:
        logits, rec_logits = self(ids, mask)
        rec = F.cross_entropy(rec_logits.transpose(1, 2), rec_y, reduction="none").mean(1)
        return F.cross_entropy(logits, y, reduction="none") + rec


def _batch(tok, n: int = 6, seed: int = 0):
    texts = ["good movie", "the plot was very boring and long", "fun", "awful actor",
             "it is not a great film but fine", "music"][:n]
    enc = tok(texts, padding=True, return_tensors="pt")
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    rec_y = torch.randint(0, 7, (n, 2), generator=g)
    return enc["input_ids"], enc["attention_mask"], y, rec_y


def _naive(model: TinyPrompt, ids, mask, y, rec_y) -> dict[str, torch.Tensor]:
    """Per-example gradients by one backward pass per example."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    out: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for b in range(ids.shape[0]):
        model.zero_grad(set_to_none=True)
        sl = slice(b, b + 1)
        model.per_example_loss(ids[sl], mask[sl], y[sl], rec_y[sl]).sum().backward()
        for n, p in model.named_parameters():
            if p.requires_grad:
                out[n].append(p.grad.detach().clone())
    model.zero_grad(set_to_none=True)
    return {n: torch.stack(v) for n, v in out.items()}


@pytest.fixture(scope="module")
def dp_tok(tmp_path_factory):
    """A working WordPiece tokenizer (``from_pretrained`` on a vocab folder: in transformers 5
    ``BertTokenizerFast(vocab_file=...)`` silently keeps only the special tokens)."""
    from transformers import BertTokenizerFast

    d = tmp_path_factory.mktemp("dp_tok")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizerFast.from_pretrained(str(d))
    assert tok("good movie")["input_ids"][1:3] == [VOCAB.index("good"), VOCAB.index("movie")]
    return tok


def _bert(tok) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return BertModel(cfg).eval()


@pytest.fixture()
def tiny_bert(dp_tok):
    from rapt.models import from_model

    return from_model(_bert(dp_tok), dp_tok, name="dp-tiny-bert", kind="encoder")


@pytest.fixture()
def setup(tiny_bert):
    torch.manual_seed(0)
    model = TinyPrompt(tiny_bert.model)
    return model, _batch(tiny_bert.tokenizer)


def test_broadcast_per_example_grads_match_naive_loop(setup):
    model, (ids, mask, y, rec_y) = setup
    naive = _naive(model, ids, mask, y, rec_y)
    dp = DPSGD(model, DPConfig(noise_multiplier=1.0, sample_rate=0.5), n_examples=12, steps=5,
               seed=0)
    model.per_example_loss(ids, mask, y, rec_y).sum().backward()
    got = dp.per_example_gradients()
    assert set(got) == {"prompt", "head.weight", "head.bias", "rec.weight", "rec.bias"}
    for name, g in got.items():
        assert g.shape == naive[name].shape
        torch.testing.assert_close(g, naive[name], rtol=1e-4, atol=1e-6)
    # The examples really differ (a broadcast bug that returns the batch mean would fail here).
    assert not torch.allclose(got["prompt"][0], got["prompt"][1])


def test_clipping_bounds_each_example_and_sums(setup):
    model, (ids, mask, y, rec_y) = setup
    naive = _naive(model, ids, mask, y, rec_y)
    names = list(naive)
    full = torch.cat([naive[n].reshape(ids.shape[0], -1) for n in names], 1)
    norms = full.norm(dim=1)
    c = float(norms.min()) * 0.5  # every example gets clipped
    n_ex, q = 12, 0.5
    cfg = DPConfig(noise_multiplier=1.0, max_grad_norm=c, sample_rate=q, physical_batch_size=4)
    dp = DPSGD(model, cfg, n_examples=n_ex, steps=5, seed=0)
    dp.noise_multiplier = 0.0  # clipping alone, to compare sums exactly (DPConfig refuses σ 0)
    params = dict(model.named_parameters())
    # One example per logical step: the written gradient × qN is that example's clipped gradient.
    for b in range(ids.shape[0]):
        sl = slice(b, b + 1)
        model.per_example_loss(ids[sl], mask[sl], y[sl], rec_y[sl]).sum().backward()
        dp.accumulate()
        dp.finalize()
        clipped = torch.cat([params[n].grad.reshape(-1) * q * n_ex for n in names])
        assert clipped.norm() <= c * (1 + 1e-6)
        assert clipped.norm() > c * 0.999  # clipped to C, not below
        # Clipping scales all parameters jointly: same direction as the raw gradient.
        assert F.cosine_similarity(clipped, full[b], dim=0) > 1 - 1e-5
    # Whole batch in two physical micro-batches = Σ_b clip(g_b).
    expected = (full * (c / norms).clamp(max=1).unsqueeze(1)).sum(0)
    for mb in dp.micro_batches(torch.arange(ids.shape[0])):
        model.per_example_loss(ids[mb], mask[mb], y[mb], rec_y[mb]).sum().backward()
        dp.accumulate()
    dp.finalize()
    got = torch.cat([params[n].grad.reshape(-1) * q * n_ex for n in names])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_large_clip_is_plain_sum(setup):
    model, (ids, mask, y, rec_y) = setup
    naive = _naive(model, ids, mask, y, rec_y)
    dp = DPSGD(model, DPConfig(noise_multiplier=1.0, max_grad_norm=1e6, sample_rate=1.0),
               n_examples=6, steps=1, seed=0)
    dp.noise_multiplier = 0.0  # clipping alone (DPConfig refuses σ 0)
    model.per_example_loss(ids, mask, y, rec_y).sum().backward()
    dp.accumulate()
    dp.finalize()
    for n, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, naive[n].sum(0) / 6, rtol=1e-4, atol=1e-6)


class BigPrompt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.prompt = nn.Parameter(torch.zeros(40, 500))

    def per_example_tensors(self):
        return []


def test_noise_has_sigma_c_over_qn_std():
    sigma, c, q, n = 1.7, 0.3, 0.02, 5000
    model = BigPrompt()
    dp = DPSGD(model, DPConfig(noise_multiplier=sigma, max_grad_norm=c, sample_rate=q),
               n_examples=n, steps=10, seed=123)
    dp.finalize()  # an empty Poisson batch: the released gradient is pure noise
    x = model.prompt.grad.reshape(-1).double()
    std = sigma * c / (q * n)
    assert stats.kstest(x.numpy() / std, "norm").pvalue > 1e-3
    # The test has power: a 5 % error in the std is rejected.
    assert stats.kstest(x.numpy() / (1.05 * std), "norm").pvalue < 1e-3
    assert dp.steps == 1
    # Seeded repeatability, and a different seed gives different noise.
    m2, m3 = BigPrompt(), BigPrompt()
    DPSGD(m2, dp.config, n_examples=n, steps=10, seed=123).finalize()
    DPSGD(m3, dp.config, n_examples=n, steps=10, seed=124).finalize()
    assert torch.equal(m2.prompt.grad, model.prompt.grad)
    assert not torch.equal(m3.prompt.grad, model.prompt.grad)


class KnownGradPrompt(nn.Module):
    """Broadcast-protocol module whose per-example gradient is exactly the row fed in:
    example b's loss is <prompt, x_b>, so d loss_b / d prompt = x_b."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.prompt = nn.Parameter(torch.zeros(shape))
        self._pe: list[tuple[nn.Parameter, torch.Tensor]] = []

    def per_example_tensors(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        return self._pe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.prompt.unsqueeze(0).expand(x.shape[0], *self.prompt.shape)
        e.retain_grad()
        self._pe = [(self.prompt, e)]
        return (e * x).flatten(1).sum(1)


def test_noise_once_per_logical_step_across_micro_batches():
    """One logical step spread over several physical micro-batches, per-example gradients known
    (half of them clipped): the written gradient is (Σ_b clip_C(g_b) + N(0, σ²C²)) / (q·N), the
    engine's documented normalization, so z = (grad·qN - Σ clip(g_b)) / (σC) must be N(0, 1) per
    coordinate. Two logical steps (12 examples in 4 micro-batches of 3, then 7 in 3, 3, 1),
    100,000 coordinates, KS at alpha 1e-4 (seeded, so the outcome is fixed); the test has power:
    a σ off by 10 % either way is rejected at p < 1e-6.

    Mutations caught: noise drawn in accumulate() (per micro-batch: std 2σC and √3σC here);
    dividing by the realized batch size (12, 7) instead of q·N = 10; noise std σ instead of σC;
    clipped gradients dropped or left unclipped (the residual is then ~C/σC off in 12 coords only,
    so that one is caught by the exact comparison, not the KS)."""
    sigma, c, q, n = 1.3, 0.5, 0.01, 1000
    shape = (100, 500)
    model = KnownGradPrompt(shape)
    cfg = DPConfig(noise_multiplier=sigma, max_grad_norm=c, sample_rate=q, physical_batch_size=3)
    dp = DPSGD(model, cfg, n_examples=n, steps=10, seed=2024)
    g = torch.Generator().manual_seed(7)
    zs = []
    for batch in (12, 7):
        x = torch.randn(batch, *shape, generator=g)
        # Alternate norms 0.2C (kept) and 3C (clipped to C).
        target = torch.tensor([0.2 * c if b % 2 else 3.0 * c for b in range(batch)])
        x = x * (target / x.flatten(1).norm(dim=1)).view(-1, 1, 1)
        norms = x.flatten(1).norm(dim=1)
        expected = (x * (c / (norms + 1e-6)).clamp(max=1.0).view(-1, 1, 1)).sum(0)
        mbs = dp.micro_batches(torch.arange(batch))
        assert len(mbs) == (4 if batch == 12 else 3)
        for mb in mbs:
            model(x[mb]).sum().backward()
            dp.accumulate()
        dp.finalize()
        zs.append(((model.prompt.grad * (q * n) - expected) / (sigma * c)).reshape(-1))
        model.prompt.grad = None
    z = torch.cat(zs).double().numpy()
    assert dp.steps == 2 and dp.examples_seen == 19
    assert stats.kstest(z, "norm").pvalue > 1e-4
    for wrong in (0.9, 1.1):
        assert stats.kstest(z / wrong, "norm").pvalue < 1e-6
    # Zero noise: the same steps give exactly the clipped sum over q·N (no per-batch rescaling).
    quiet = KnownGradPrompt(shape)
    dp0 = DPSGD(quiet, DPConfig(noise_multiplier=1.0, max_grad_norm=c, sample_rate=q,
                                physical_batch_size=3), n_examples=n, steps=10, seed=0)
    dp0.noise_multiplier = 0.0  # (DPConfig refuses σ 0)
    for mb in dp0.micro_batches(torch.arange(7)):
        quiet(x[mb]).sum().backward()
        dp0.accumulate()
    dp0.finalize()
    torch.testing.assert_close(quiet.prompt.grad * (q * n), expected, rtol=1e-5, atol=1e-7)


def test_epsilon_tracks_steps_and_target(setup):
    model, _ = setup
    cfg = DPConfig(target_epsilon=3.0, sample_rate=0.1)
    dp = DPSGD(model, cfg, n_examples=100, steps=50, seed=0)
    assert dp.epsilon() == 0.0
    for _ in range(50):
        dp.finalize()
    eps = dp.epsilon()
    assert dp.delta == 1e-5  # the default at N = 100: min(1e-5, 1/(10N))
    assert eps == pytest.approx(epsilon(dp.noise_multiplier, 0.1, 50, 1e-5, "rdp"))
    assert 2.9 <= eps <= 3.0  # calibrated σ spends the target budget over the planned steps
    rec = dp.record()
    for k in ("epsilon", "delta", "noise_multiplier", "max_grad_norm", "sample_rate", "steps",
              "accountant"):
        assert k in rec
    assert rec["steps"] == 50 and rec["delta"] == 1e-5 and rec["accountant"] == "rdp"
    with pytest.raises(RuntimeError, match="budget"):
        dp.finalize()  # a 51st step would overspend the calibrated budget


def test_logical_batches_follow_planned_steps_and_state(setup):
    """A checkpoint carries the step count only: no generator state (which would reveal the
    noise already drawn). A seeded engine derives step t's batch from (seed, t), so the resumed
    engine draws exactly the uninterrupted run's batches for the remaining steps and never
    replays the first ones (issue 29 item 8: resuming used to restart the seeded stream and
    replay steps 1..k).

    Mutations caught: checkpointing a generator state (the key set), dropping the step count
    (10 batches, not 9), restarting the seeded stream on resume (resumed[0] == the step-1
    batch)."""
    model, _ = setup
    cfg = DPConfig(noise_multiplier=1.0, sample_rate=0.5)
    dp = DPSGD(model, cfg, n_examples=200, steps=10, seed=5)
    assert len(list(dp.logical_batches())) == 10
    dp2 = DPSGD(model, cfg, n_examples=200, steps=10, seed=5)
    dp2.finalize()
    state = dp2.state_dict()
    assert set(state) == {"steps", "examples_seen", "noise_multiplier"}
    rest = [b.tolist() for b in dp2.logical_batches()]
    assert len(rest) == 9
    dp3 = DPSGD(model, cfg, n_examples=200, steps=10, seed=5)
    dp3.load_state_dict(state)
    resumed = [b.tolist() for b in dp3.logical_batches()]
    assert len(resumed) == 9 and dp3.epsilon() == dp2.epsilon()
    uninterrupted = [b.tolist() for b in DPSGD(model, cfg, n_examples=200, steps=10,
                                               seed=5).logical_batches()]
    assert resumed == rest == uninterrupted[1:]
    assert resumed[0] != uninterrupted[0]  # step 2's batch, not step 1's again


def _noise_steps(dp: DPSGD, n: int) -> list[torch.Tensor]:
    """The noise of ``n`` finalize() calls with no gradient: p.grad is then noise / (q·N)."""
    out = []
    for _ in range(n):
        dp.finalize()
        out.append(torch.cat([p.grad.detach().flatten().clone() for p in dp.params]))
    return out


def test_seeded_resume_never_replays_noise_and_repeats(setup):
    """Issue 29 item 8: a seeded engine resumed at step k = 3 must not add the noise of steps
    1..3 again, and resuming twice from the same checkpoint gives the same noise (a seeded run
    stays repeatable; here it even equals the uninterrupted run's steps 4..6).

    Mutation caught (the old code): one seeded stream per engine, restarted on resume, so the
    resumed step 4 added step 1's noise exactly."""
    model, _ = setup
    cfg = DPConfig(noise_multiplier=1.0, sample_rate=0.5)
    full = _noise_steps(DPSGD(model, cfg, n_examples=20, steps=6, seed=11), 6)
    first = DPSGD(model, cfg, n_examples=20, steps=6, seed=11)
    before = _noise_steps(first, 3)
    state = first.state_dict()
    resumed = []
    for _ in range(2):
        dp = DPSGD(model, cfg, n_examples=20, steps=6, seed=11)
        dp.load_state_dict(state)
        assert dp.steps == 3
        resumed.append(_noise_steps(dp, 3))
    for a, b in zip(before, full[:3], strict=True):
        assert torch.equal(a, b)
    for r in resumed[0]:
        assert all(not torch.allclose(r, b) for b in before)
    for a, b, c in zip(resumed[0], resumed[1], full[3:], strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    # and the sampled batches are not replayed either
    dp = DPSGD(model, cfg, n_examples=20, steps=6, seed=11)
    dp.load_state_dict(state)
    scratch = [b.tolist() for b in DPSGD(model, cfg, n_examples=20, steps=6,
                                         seed=11).logical_batches()]
    assert [b.tolist() for b in dp.logical_batches()] == scratch[3:]


def test_unseeded_noise_differs_between_engines(setup):
    """Two unseeded engines on the same gradients add different noise; their record says
    seeded: false. Mutation caught: a fixed fallback seed when ``seed=None``."""
    model, _ = setup
    cfg = DPConfig(noise_multiplier=1.0, sample_rate=0.5)
    grads = []
    for _ in range(2):
        dp = DPSGD(model, cfg, n_examples=10, steps=3)
        assert dp.record()["seeded"] is False
        dp.finalize()
        grads.append([p.grad.clone() for p in dp.params])
        dp.close()
    assert any(not torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_uncovered_trainable_parameter_is_refused(tiny_bert):
    cfg = DPConfig(noise_multiplier=1.0, sample_rate=0.5)
    inner = TinyPrompt(tiny_bert.model)
    # Trainable, neither broadcast nor nn.Linear, outside the broadcasting module: at once.
    outer = nn.ModuleDict({"tuner": inner, "norm": nn.LayerNorm(4)})
    with pytest.raises(ValueError, match="norm.weight"):
        DPSGD(outer, cfg, n_examples=10, steps=1)
    # Inside the broadcasting module it can only be seen after a backward pass.
    inner.norm = nn.LayerNorm(4)
    dp = DPSGD(inner, cfg, n_examples=10, steps=1)
    ids, mask, y, rec_y = _batch(tiny_bert.tokenizer)
    inner.per_example_loss(ids, mask, y, rec_y).sum().backward()
    with pytest.raises(RuntimeError, match="norm.weight"):
        dp.accumulate()


def test_accumulate_without_backward_and_empty_data(setup):
    model, (ids, mask, y, rec_y) = setup
    dp = DPSGD(model, DPConfig(noise_multiplier=1.0, sample_rate=0.5), n_examples=10, steps=1)
    with pytest.raises(RuntimeError, match="backward"):
        dp.accumulate()
    with pytest.raises(ValueError, match="non-empty"):
        DPSGD(model, DPConfig(noise_multiplier=1.0, sample_rate=0.5), n_examples=0, steps=1)
    with pytest.raises(ValueError, match="sampling rate"):
        DPSGD(model, DPConfig(noise_multiplier=1.0), n_examples=10, steps=1, batch_size=20)


def test_linear_outside_the_batch_is_refused(tiny_bert):
    """A projection applied once to the prompt (not per example) has no per-example path."""

    class Projected(TinyPrompt):
        def __init__(self, bert):
            super().__init__(bert)
            d = bert.config.hidden_size
            self.proj = nn.Linear(d, d)

        def forward(self, ids, mask):
            b, n = ids.shape[0], self.prompt.shape[0]
            p = self.proj(self.prompt)  # (n, d): no batch dimension
            e = p.unsqueeze(0).expand(b, -1, -1)
            self._pe = []
            x = torch.cat([e, self.bert.get_input_embeddings()(ids)], 1)
            am = torch.cat([torch.ones(b, n, dtype=mask.dtype), mask], 1)
            h = self.bert(inputs_embeds=x, attention_mask=am).last_hidden_state
            return self.head(h[:, n]), self.rec(h[:, n + 1:n + 1 + self.m])

    model = Projected(tiny_bert.model)
    ids, mask, y, rec_y = _batch(tiny_bert.tokenizer)
    model.prompt.requires_grad_(False)
    dp = DPSGD(model, DPConfig(noise_multiplier=1.0, sample_rate=0.5), n_examples=10, steps=1)
    model.per_example_loss(ids, mask, y, rec_y).sum().backward()
    with pytest.raises(RuntimeError, match="batch size"):
        dp.accumulate()


def test_no_noise_is_refused_and_a_delta_too_large_fails_at_build(setup):
    """Old behaviour: σ = 0 trained "under DP" and reported ε = ∞ (the service showed null, as
    for a job without DP); δ = 1/N was the default, and a δ whose ε conversion goes below 0
    reported ε = 0.0 at every step."""
    model, _ = setup
    with pytest.raises(ValueError, match="no privacy guarantee"):
        DPConfig(noise_multiplier=0.0, sample_rate=0.5)
    assert math.isinf(epsilon(0.0, 0.5, 2, 1e-5))  # the accountant's answer stays honest
    with pytest.raises(ValueError, match="not below 1/N"):
        DPSGD(model, DPConfig(noise_multiplier=5.0, delta=0.5), n_examples=2, steps=2,
              batch_size=1)
    with pytest.raises(ValueError, match="too large for a meaningful ε"):
        DPSGD(model, DPConfig(noise_multiplier=50.0, delta=0.4), n_examples=2, steps=2,
              batch_size=1)
    dp = DPSGD(model, DPConfig(noise_multiplier=5.0), n_examples=2, steps=2, batch_size=1)
    dp.finalize()
    assert dp.delta == 1e-5 and dp.epsilon() > 0.4
    assert dp.epsilon() == pytest.approx(epsilon(5.0, 0.5, 1, 1e-5))
    dp.close()
