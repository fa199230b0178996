"""The bigram context prior and the HMM decoding of the Bayes attacker (rapt.attacks.bigram,
rapt.attacks.bayes_bigram), on tiny vocabularies."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from _bayes import EMB, ETA, exact_likelihood, prior_with_ratio
from _minilm_rows import minilm_rows

from rapt.attacks.bayes import BayesAttacker, switch_error, unigram_log_prior
from rapt.attacks.bayes_bigram import BigramBayesAttacker, bigram_bayes_attack, context_bound
from rapt.attacks.bigram import BigramPrior, forward_backward
from rapt.attacks.recovery import ATTACKERS, ReconstructionInput

# word 1 is frequent everywhere; word 0 only ever appears between 3 and 4
PUBLIC = [[1] * 5] * 40 + [[3, 0, 4]] * 30 + [[2, 2]] * 5


def _prior(rows=PUBLIC, V=5, **kw) -> BigramPrior:
    return BigramPrior.fit(rows, V, **kw)


def test_bigram_prior_is_interpolated_kneser_ney_and_normalized():
    pr = _prior()
    V = 5
    for a in range(V + 1):  # every context, the boundary included, sums to one
        p = pr.log_prob(torch.full((V + 1,), a), torch.arange(V + 1)).exp()
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
        assert bool((p > 0).all())  # every token keeps some mass after every context
    # by hand: c(3, 0) = 30, c(3) = 30, one type after 3; q(0) = (1 + 1) / Σ
    cont = torch.tensor([1, 2, 2, 1, 1, 3], dtype=torch.float64)  # contexts each word follows
    q = (cont + 1.0) / (cont + 1.0).sum()  # + alpha
    want = (30 - 0.75) / 30 + 0.75 * 1 / 30 * q[0]
    assert float(pr.log_prob(torch.tensor(3), torch.tensor(0)).exp()) == pytest.approx(
        float(want))
    # an unseen pair backs off to λ(a)·q(b); an unseen context to q(b)
    assert float(pr.log_prob(torch.tensor(3), torch.tensor(1)).exp()) == pytest.approx(
        float(0.75 / 30 * q[1]))
    unseen = _prior([[1, 1]], V)
    assert float(unseen.log_prob(torch.tensor(4), torch.tensor(0)).exp()) == pytest.approx(
        float(unseen.log_q[0].exp()))
    assert math.isinf(float(pr.log_prob(torch.tensor(-1), torch.tensor(0))))
    with pytest.raises(ValueError, match="discount"):
        _prior(discount=1.0)


def _brute_force(states: torch.Tensor, log_emit: torch.Tensor, pr: BigramPrior) -> torch.Tensor:
    """Posterior marginals of one row by summing over every hidden sequence."""
    T, S = states.shape
    bnd = pr.boundary
    post = torch.zeros(T, S, dtype=torch.float64)
    choices = [[s for s in range(S) if states[t, s] >= 0] for t in range(T)]
    for path in itertools.product(*choices):
        ids = [bnd] + [int(states[t, s]) for t, s in enumerate(path)] + [bnd]
        lp = sum(float(log_emit[t, s]) for t, s in enumerate(path))
        for a, b in itertools.pairwise(ids):
            if not (a == bnd and b == bnd):  # the chain stays at the boundary past the end
                lp += float(pr.log_prob(torch.tensor(a), torch.tensor(b)))
        for t, s in enumerate(path):
            post[t, s] += math.exp(lp)
    return post / post.sum(1, keepdim=True)


def test_forward_backward_equals_enumeration_of_all_hidden_sequences():
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 4, (int(n),), generator=g).tolist()
            for n in torch.randint(1, 7, (60,), generator=g)]
    pr = BigramPrior.fit(rows, 4, discount=0.6)
    B, T, S = 3, 5, 3
    states = torch.randint(0, 4, (B, T, S), generator=g)
    states[0, 1, 2] = -1  # a position with fewer states
    states[1, 3:, 0], states[1, 3:, 1:] = pr.boundary, -1  # a row of 3 tokens
    states[2, 4, 0], states[2, 4, 1:] = pr.boundary, -1
    log_emit = torch.rand(B, T, S, generator=g, dtype=torch.float64).log()
    log_emit[states == pr.boundary] = 0.0
    post = forward_backward(states, log_emit, pr).exp()
    for b in range(B):
        want = _brute_force(states[b], log_emit[b], pr)
        got = post[b].nan_to_num(0.0)
        assert torch.allclose(got, want, atol=1e-10), (b, got, want)


def test_context_bound_holds_for_any_emissions_of_the_neighbours():
    """The strict rule's bound on the context factor is below the exact factor (forward-
    backward's posterior ratio divided by the emission ratio) for random neighbour emissions."""
    g = torch.Generator().manual_seed(1)
    pr = _prior()
    states = torch.tensor([[[3, 1, 2], [1, 0, 4], [4, 1, -1], [5, -1, -1]]])
    b, t = torch.tensor([0]), torch.tensor([1])
    x, y = torch.tensor([0]), torch.tensor([1])
    bound = float(context_bound(states, pr, b, t, x, y))
    for _ in range(200):
        emit = torch.rand(1, 4, 3, generator=g, dtype=torch.float64).log() * 4
        emit[0, 3] = 0.0
        post = forward_backward(states, emit, pr)
        ratio = float(post[0, 1, 1] - post[0, 1, 0] - (emit[0, 1, 1] - emit[0, 1, 0]))
        assert bound <= ratio + 1e-9


def _attacker(public=PUBLIC, samples: int = 4000, seed: int = 0, **kw) -> BigramBayesAttacker:
    screen = BayesAttacker.build(EMB, ETA, unigram_log_prior(public, 5), k=5, samples=samples,
                                 seed=seed, **kw)
    return BigramBayesAttacker(screen, _prior(public), candidates=4)


def test_a_context_that_makes_the_word_obvious_changes_the_guess_the_unigram_keeps():
    """Word 1 is released between 3 and 4, where public text only ever has 0: the unigram rule
    keeps 1 (it is the more frequent word and the likelier to stay itself); the bigram prior
    guesses 0. Dropping the transitions (the context) keeps 1 here too."""
    for seed in range(3):
        att = _attacker(seed=seed)
        assert att.screen.guess(torch.tensor([3, 1, 4])).tolist()[1] == 1
        dec = att.decide([[3, 1, 4], [1, 1, 1]])
        assert dec.guess == [[3, 0, 4], [1, 1, 1]]
        assert dec.switched == 1 and dec.confirmed >= 1 and dec.confirm_draws > 0


def test_rows_whose_context_agrees_with_the_release_keep_it():
    """Public text where 1, not 0, comes between 3 and 4: the release is never changed,
    whatever the seed."""
    public = [[1] * 5] * 40 + [[3, 1, 4]] * 30 + [[2, 2]] * 5
    for seed in range(3):
        dec = _attacker(public, seed=seed).decide([[3, 1, 4], [1, 1, 1, 1], [3, 1]])
        assert dec.guess == [[3, 1, 4], [1, 1, 1, 1], [3, 1]]


def test_no_change_without_confirmed_bounds():
    """The screen's point posterior flags the change, but four fresh draws bound nothing: the
    release stays (a decoder that trusted the point estimates would change it)."""
    att = _attacker(confirm_samples=4)
    dec = att.decide([[3, 1, 4]])
    assert dec.flagged == 1 and dec.confirmed == 1
    assert dec.guess == [[3, 1, 4]] and dec.switched == 0


def test_never_worse_than_the_release_where_the_confirm_draws_are_uncertain():
    """The counterpart of the unigram attacker's many-seed test: where the exact posterior
    keeps the release (its challenger's is 0.95 of it), the decoder changes it only when a
    Wilson bound of its confirm draws fails, with probability at most 2Φ(−3) = 0.0027 a run,
    even with an 8-draw screen and 64 confirm draws. The prior is a bigram table whose every
    context predicts the same unigram (no seen bigram), so the context factors cancel and the
    exact ratio is known. 200 runs, at most 7 changes: the rule fails by luck with probability
    < 1e-7 (binomial, p 0.0027). Mutation caught: ``_confirm`` with point estimates (z = 0)
    changes about a quarter of the runs (48 of these 200)."""
    lik = exact_likelihood(EMB, ETA)
    log_prior = prior_with_ratio(lik, 0.95)
    table = BigramPrior(5, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64),
                        torch.zeros(6, dtype=torch.float64),
                        torch.cat([log_prior, torch.zeros(1, dtype=torch.float64)]))
    changed = flagged = 0
    for seed in range(200):
        screen = BayesAttacker.build(EMB, ETA, log_prior, k=5, samples=8, confirm_samples=64,
                                     seed=seed)
        dec = BigramBayesAttacker(screen, table, candidates=4).decide([[1]])
        changed += dec.guess != [[1]]
        flagged += dec.flagged
    assert flagged > 40  # the screen's point posterior wants the change in a good share
    assert changed <= 7 and 200 * switch_error(3.0) < 0.6, changed


def test_strict_rule_needs_every_neighbour_candidate_to_agree():
    """Under the strict rule a change needs the context bound over every state of the
    neighbours: here 1, a screened candidate beside the release 3, is followed by 1 far more
    often than by 0, so the bound cannot exclude that context and 1 stays; the default rule,
    which weighs the neighbours by their pessimistic posterior, changes it to 0."""
    att = _attacker()
    assert att.decide([[3, 1, 4]]).guess == [[3, 0, 4]]
    att.strict = True
    assert att.decide([[3, 1, 4]]).guess == [[3, 1, 4]]


def test_a_special_token_in_the_row_stays_and_the_row_still_decodes():
    """The mechanism passes specials through: the prior must not give them zero probability
    (that would zero the whole row's posterior, and no guess in it could change)."""
    inp = ReconstructionInput([[3, 1, 4, 2]], EMB, ETA, special_ids=(2,), public_rows=PUBLIC,
                              seed=0, options={"bayes_k": 5, "bigram_samples": 4000,
                                               "bigram_candidates": 4})
    assert bigram_bayes_attack(inp) == [[3, 0, 4, 2]]


def test_registered_and_seeded():
    assert "bayes-bigram" in ATTACKERS
    inp = ReconstructionInput([[3, 1, 4], [], [1, 1]], EMB, ETA, public_rows=PUBLIC, seed=2,
                              options={"bayes_k": 5, "bigram_samples": 2000})
    out = bigram_bayes_attack(inp)
    assert out == bigram_bayes_attack(inp) and out[1] == [] and out[0] == [3, 0, 4]
    with pytest.raises(ValueError, match="public_rows"):
        bigram_bayes_attack(ReconstructionInput([[1]], EMB, ETA))


@pytest.mark.integration
def test_minilm_rows_recover_at_least_what_nearest_neighbour_does(shared_data, monkeypatch):
    """Real rows (MiniLM, public text, P ≈ 0.5): the bigram decoder recovers at least nearest
    neighbour's share minus the stated error (three standard errors of the positions it
    changed)."""
    from rapt.privacy.mechanism import Privatizer
    from rapt.privacy.nn_search import build_index

    r = minilm_rows(shared_data, monkeypatch)
    bb, attacked, public, emb, cand, flat = (r.backbone, r.attacked, r.public, r.embeddings,
                                             r.candidates, r.flat)
    eta, index = 75.0, build_index(emb[cand].float(), "fast")
    priv = Privatizer(emb, eta, special_ids=bb.special_ids, candidate_ids=cand, seed=3,
                      index=index).privatize_ids(flat)
    released = [t.tolist() for t in torch.split(priv, [len(r) for r in attacked])]
    inp = ReconstructionInput(released, emb, eta, tuple(bb.special_ids), cand, index,
                              public_rows=public, seed=4,
                              options={"bayes_k": 300, "bigram_samples": 256,
                                       "bayes_confirm_samples": 1024, "bayes_max_confirm": 32})
    guess = torch.tensor([i for r in bigram_bayes_attack(inp) for i in r])
    changed = int((guess != priv).sum())
    stated = 3 * math.sqrt(changed) / flat.numel()
    ours, nn = float((guess == flat).float().mean()), float((priv == flat).float().mean())
    assert 0.3 < 1 - nn < 0.7  # P ≈ 0.5
    assert ours >= nn - stated, (ours, nn, changed)
