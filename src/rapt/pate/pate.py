"""PromptPATE (Flocks §4.2): private discrete prompts through an ensemble of prompted teachers.

1. Teachers: disjoint k-shot prompts from the private set (each private example in at most one
   teacher, so one example changes at most one vote).
2. Each teacher votes on public unlabeled inputs with its contextually calibrated prediction
   (Zhao et al. 2021: p_cal ∝ p / p("N/A")).
3. Confident-GNMax (``rapt.pate.gnmax``) releases noisy labels, with RDP accounting and a budget
   stop.
4. Student: candidate k-shot prompts built from released (public input, noisy label) pairs; the
   best on a held-out part of the released pairs is the private prompt. Private data is never
   used for selection.

Randomness. Data splits (the teacher partition, student candidate picks) take ``seed`` (default
0: they need no secrecy, the analysis holds for any fixed partition). The GNMax vote noise is the
privacy noise: it comes from the OS CSPRNG unless ``noise_seed`` is passed, and a run with a
noise seed is marked ``seeded: true`` (whoever knows the seed knows the noise: no guarantee).

Reports (:func:`pate_experiment`) keep two sections apart: ``private_release`` (student prompts,
released-label counts, ε composed over every release from the same teachers, δ, ``seeded``) and
``diagnostics_not_private`` (ε = ∞: per-query ε curves, consensus, teacher indices, baselines,
test accuracies), which reads the private votes and data directly and must not be published.

Everything here works on in-memory examples and a :class:`rapt.pate.scorer.LabelScorer`; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rapt.pate.gnmax import (
    ConfidentGNMax,
    GNMaxConfig,
    GNMaxResult,
    compose_epsilon,
    epsilon_from_rdp,
    rdp_data_independent_release,
    vote_counts,
)
from rapt.pate.scorer import LabelScorer, normalize


class PateInputError(ValueError):
    """Bad PromptPATE / MIA input, raised before any LLM query."""


Demo = tuple[str, int, str | None]  # (text, label index, text_pair)
Progress = Callable[[int], None]  # called with the number of votes just computed


@dataclass(frozen=True)
class PromptTemplate:
    """A Zhao et al. (2021) style template. ``label_words[i]`` verbalizes label index i.

    ``input_format`` has ``{text}`` (and ``{pair}`` for pair tasks) and ends right before the
    label word; a demonstration is ``input_format + label_word + demo_sep``.
    """

    input_format: str
    label_words: tuple[str, ...]
    instruction: str = ""
    demo_sep: str = "\n\n"

    def query(self, text: str, pair: str | None = None) -> str:
        return self.input_format.format(text=text, pair=pair if pair is not None else "")

    def demo(self, text: str, label: int, pair: str | None = None) -> str:
        return self.query(text, pair) + self.label_words[label] + self.demo_sep

    def prefix(self, demos: Sequence[Demo]) -> str:
        return self.instruction + "".join(self.demo(t, y, p) for t, y, p in demos)

    @property
    def content_free(self) -> str:
        return self.query("N/A", "N/A")


# Templates from Zhao et al. (2021), Table 14, lower-cased SST-2 words (SmolLM2 scored them
# better than the capitalized ones in a short check). Label order = rapt.data label_names.
TEMPLATES: dict[str, PromptTemplate] = {
    "sst2-sentences": PromptTemplate("Review: {text}\nSentiment:", (" negative", " positive")),
    "trec": PromptTemplate(
        "Question: {text}\nAnswer Type:",
        # rapt.data order: ABBR, DESC, ENTY, HUM, LOC, NUM
        (" Abbreviation", " Description", " Entity", " Person", " Location", " Number"),
        instruction="Classify the questions based on whether their answer type is a Number, "
                    "Location, Person, Description, Entity, or Abbreviation.\n\n"),
    "cb": PromptTemplate("{text}\nquestion: {pair}. true, false, or neither?\nanswer:",
                         (" true", " false", " neither")),
}
TEMPLATES["sst2"] = TEMPLATES["sst2-sentences"]


def get_template(task: str) -> PromptTemplate:
    if task not in TEMPLATES:
        raise PateInputError(f"no prompt template for task '{task}' "
                             f"(known: {', '.join(TEMPLATES)})")
    return TEMPLATES[task]


def as_demos(examples: Sequence) -> list[Demo]:
    """rapt.data Examples (text, label, text_pair) -> demo tuples."""
    return [(e.text, int(e.label), getattr(e, "text_pair", None)) for e in examples]


# -- teachers ------------------------------------------------------------------------------

def make_teachers(n_private: int, n_teachers: int, shots: int, seed: int = 0) -> list[list[int]]:
    """Disjoint index sets: teacher i gets ``shots`` private examples, none shared."""
    if n_teachers < 1 or shots < 1:
        raise PateInputError(f"need >= 1 teacher and >= 1 shot, got {n_teachers} x {shots}")
    if n_private < n_teachers * shots:
        raise PateInputError(
            f"{n_teachers} teachers x {shots} shots need {n_teachers * shots} private examples, "
            f"only {n_private} given (each example may serve in at most one teacher)")
    perm = np.random.default_rng(seed).permutation(n_private)
    return [perm[i * shots:(i + 1) * shots].tolist() for i in range(n_teachers)]


def calibrate(p: np.ndarray, p_cf: np.ndarray) -> np.ndarray:
    """Contextual calibration: normalize(normalize(p) / normalize(p_cf)), rows over labels."""
    return normalize(normalize(p) / np.clip(normalize(p_cf), 1e-12, None))


def prompt_probs(scorer: LabelScorer, template: PromptTemplate, demos: Sequence[Demo],
                 inputs: Sequence[tuple[str, str | None]], *, calibrated: bool = True
                 ) -> np.ndarray:
    """Label probabilities (N, C), rows summing to 1, of one prompt on N inputs (text, pair).

    The content-free input rides in the same call so a caching scorer encodes the prefix once.
    """
    prefix = template.prefix(demos)
    queries = [template.query(t, p) for t, p in inputs]
    if calibrated:
        raw = scorer.label_probs(prefix, [template.content_free, *queries])
        return calibrate(raw[1:], raw[:1])
    return normalize(scorer.label_probs(prefix, queries))


def teacher_votes(scorer: LabelScorer, template: PromptTemplate, teacher_demos: Sequence[
                  Sequence[Demo]], inputs: Sequence[tuple[str, str | None]], *,
                  calibrated: bool = True, top_token_only: bool = False,
                  progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Votes (E, Q) (label indices) and probabilities (E, Q, C) of every teacher.

    ``top_token_only`` votes with the LLM's most likely next token alone (an API without
    probabilities, Flocks App. D.2): no calibration, no probabilities returned, and a teacher
    whose top token is no label word casts no vote (-1).
    """
    if top_token_only:
        votes = []
        for demos in teacher_demos:
            votes.append(scorer.top_labels(template.prefix(demos),
                                           [template.query(t, p) for t, p in inputs]))
            if progress:
                progress(len(inputs))
        return np.stack(votes).astype(np.int64), None
    probs = []
    for demos in teacher_demos:
        probs.append(prompt_probs(scorer, template, demos, inputs, calibrated=calibrated))
        if progress:
            progress(len(inputs) + int(calibrated))
    p = np.stack(probs)
    return p.argmax(axis=-1), p


def accuracy(scorer: LabelScorer, template: PromptTemplate, demos: Sequence[Demo],
             test: Sequence[Demo], *, calibrated: bool = True) -> float:
    """Test accuracy of one prompt (``demos`` may be empty: zero-shot)."""
    p = prompt_probs(scorer, template, demos, [(t, q) for t, _, q in test], calibrated=calibrated)
    return float(np.mean(p.argmax(axis=1) == np.array([y for _, y, _ in test])))


# -- student -------------------------------------------------------------------------------

@dataclass
class StudentResult:
    demos: list[Demo]  # the selected student prompt's demonstrations (public inputs)
    val_accuracy: float  # on held-out released pairs (noisy labels)
    candidates: int
    val_size: int
    candidate_val_accuracies: list[float] = field(default_factory=list)


def select_student(scorer: LabelScorer, template: PromptTemplate, released: Sequence[Demo], *,
                   shots: int = 1, n_candidates: int = 10, val_fraction: float = 0.5,
                   max_val: int | None = None, calibrated: bool = True, seed: int = 0,
                   progress: Progress | None = None) -> StudentResult:
    """Pick the best k-shot prompt built from released pairs, judged on the other released pairs.

    Candidates come from one part of the released pairs and validation from the rest, so a
    candidate never scores its own demonstrations.
    """
    if len(released) < 2:
        raise PateInputError(f"only {len(released)} released labels: too few to build and "
                             "validate a student prompt (lower the threshold or raise the budget)")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(released))
    n_val = min(max(1, int(round(val_fraction * len(released)))), len(released) - shots)
    if max_val is not None:
        n_val = min(n_val, max_val)
    if n_val < 1 or len(released) - n_val < shots:
        raise PateInputError(f"{len(released)} released labels cannot give {shots}-shot "
                             "candidates and a validation set")
    val = [released[i] for i in order[:n_val]]
    pool = [released[i] for i in order[n_val:]]
    n_cand = max(1, min(n_candidates, len(pool) // shots))
    cands = [[pool[(j * shots + s)] for s in range(shots)] for j in range(n_cand)]
    accs = []
    for demos in cands:
        accs.append(accuracy(scorer, template, demos, val, calibrated=calibrated))
        if progress:
            progress(len(val) + int(calibrated))
    best = int(np.argmax(accs))
    return StudentResult(demos=list(cands[best]), val_accuracy=accs[best], candidates=n_cand,
                         val_size=len(val), candidate_val_accuracies=accs)


# -- accounting over releases --------------------------------------------------------------

PRIVATE_RELEASE_NOTE = (
    "Covered by (ε, δ)-DP for the private examples in the teacher prompts: the student prompts "
    "and released labels are post-processing of the Confident-GNMax outputs. 'epsilon' is the "
    "data-dependent bound (Papernot et al. 2018, Thm. 6) composed over every release from the "
    "same teachers; it is computed from the private votes, so publishing that number is itself "
    "NOT differentially private (a smooth-sensitivity release is future work, not implemented). "
    "'epsilon_data_independent' depends only on σ1, σ2, δ and the numbers of queries processed "
    "and answered, and may be published. Under a budget stop with data-dependent accounting the "
    "stopping point depends on the private votes as well.")
DIAGNOSTICS_NOTE = (
    "NOT covered by ε (ε = ∞): per-query ε curves, consensus statistics, teacher indices, "
    "baselines and test accuracies are computed directly from the private votes, the private "
    "examples or labelled test data. For analysis only; never publish next to the release.")
SEEDED_WARNING = (
    "warning: the GNMax vote noise is seeded: whoever knows the seed knows the noise, so this run "
    "gives NO differential-privacy guarantee (report marked seeded: true). Use a noise seed only "
    "for tests and benchmarks; omit it to draw the noise from OS entropy.")


def release_noise_seeds(noise_seed: int | None, n: int) -> list[int | None]:
    """One noise seed per release: None each (OS entropy) or n independent streams derived from
    ``noise_seed`` (two releases must never share noise)."""
    if noise_seed is None:
        return [None] * n
    return [int(s.generate_state(1, np.uint64)[0] >> np.uint64(1))
            for s in np.random.SeedSequence(noise_seed).spawn(n)]


# -- the whole pipeline --------------------------------------------------------------------

@dataclass
class PateRun:
    """Outcome of one PromptPATE labelling + student selection (one release)."""

    teachers: list[list[int]]
    votes: np.ndarray  # (E, Q)
    counts: np.ndarray  # (Q, C)
    gnmax: GNMaxResult
    released: list[Demo]
    student: StudentResult | None
    consensus: np.ndarray  # (Q,) fraction of teachers voting for the plurality label
    config: GNMaxConfig
    seeded: bool  # the GNMax noise came from a caller's seed: no privacy guarantee

    @property
    def rdp_data_independent(self) -> np.ndarray:
        return rdp_data_independent_release(self.config, self.gnmax.queried,
                                            int(self.gnmax.answered.sum()))

    @property
    def epsilon_data_independent(self) -> float:
        return epsilon_from_rdp(self.rdp_data_independent, self.config.orders,
                                self.config.delta)[0]

    def release(self, template: PromptTemplate | None = None) -> dict:
        """What may leave the curator (see PRIVATE_RELEASE_NOTE). No ε here: a release's ε is
        reported only composed with every other release from the same teachers."""
        g, s = self.gnmax, self.student
        return {
            "student_prompt": template.prefix(s.demos) if s and template else None,
            "student_demos": [list(d) for d in s.demos] if s else None,
            "released_labels": len(self.released), "queried": g.queried,
            "stopped_by_budget": g.stopped_by_budget,
            "student_val_accuracy": s.val_accuracy if s else None,  # on released pairs
            "seeded": self.seeded,
        }

    def diagnostics(self) -> dict:
        """ε = ∞: read straight from the private votes (see DIAGNOSTICS_NOTE). The ε of this
        release alone is here too: it understates the cost when other releases share teachers."""
        g = self.gnmax
        return {
            "epsilon_alone": g.epsilon,
            "epsilon_data_independent_alone": self.epsilon_data_independent,
            "epsilon_curve": g.epsilon_curve.tolist(), "order": g.order,
            "answered": int(g.answered.sum()),
            "mean_consensus": float(self.consensus.mean()) if len(self.consensus) else None,
            "consensus": self.consensus.tolist(),
            "candidate_val_accuracies": self.student.candidate_val_accuracies
            if self.student else None,
        }


def validate_inputs(n_private: int, n_teachers: int, shots: int, n_public: int,
                    scorer: LabelScorer | None = None, template: PromptTemplate | None = None,
                    num_labels: int | None = None) -> None:
    """All checks that need no LLM call; raises PateInputError."""
    if n_public < 1:
        raise PateInputError("the public set is empty: PromptPATE needs public unlabeled inputs")
    make_teachers(n_private, n_teachers, shots)
    if template is not None and num_labels is not None and len(template.label_words) != num_labels:
        raise PateInputError(f"template has {len(template.label_words)} label words, the data "
                             f"has {num_labels} labels")
    if scorer is not None and template is not None and \
            list(scorer.label_words) != list(template.label_words):
        raise PateInputError("scorer and template label words differ")


def run_pate(scorer: LabelScorer, template: PromptTemplate, private: Sequence[Demo],
             public: Sequence[tuple[str, str | None]], gnmax: GNMaxConfig, *, n_teachers: int,
             shots: int = 1, calibrated: bool = True, student_shots: int = 1,
             n_candidates: int = 10, val_fraction: float = 0.5, max_val: int | None = None,
             seed: int = 0, noise_seed: int | None = None,
             spent_rdp: np.ndarray | None = None, progress: Progress | None = None,
             votes: np.ndarray | None = None) -> PateRun:
    """Teachers vote on ``public``; Confident-GNMax labels; a student prompt is selected.

    ``seed`` drives the data splits only (teacher partition, student candidates). The GNMax
    noise comes from OS entropy unless ``noise_seed`` is given (then the run is ``seeded``).
    ``spent_rdp``: RDP already spent by earlier releases from the same teachers, so a budget
    stop applies to the composition. ``votes`` (E, Q) can be passed to reuse teacher votes.
    """
    validate_inputs(len(private), n_teachers, shots, len(public), scorer, template)
    teachers = make_teachers(len(private), n_teachers, shots, seed)
    if votes is None:
        demos = [[private[i] for i in t] for t in teachers]
        votes, _ = teacher_votes(scorer, template, demos, public, calibrated=calibrated,
                                 progress=progress)
    c = len(template.label_words)
    counts = vote_counts(votes, c)
    consensus = counts.max(axis=1) / max(1, votes.shape[0])
    agg = ConfidentGNMax(gnmax, seed=noise_seed)
    res = agg.run(counts, spent_rdp=spent_rdp)
    released = [(public[i][0], int(res.labels[i]), public[i][1])
                for i in range(len(public)) if res.labels[i] >= 0]
    student = None
    if len(released) >= student_shots + 1:
        student = select_student(scorer, template, released, shots=student_shots,
                                 n_candidates=n_candidates, val_fraction=val_fraction,
                                 max_val=max_val, calibrated=calibrated, seed=seed,
                                 progress=progress)
    return PateRun(teachers=teachers, votes=votes, counts=counts, gnmax=res, released=released,
                   student=student, consensus=consensus, config=gnmax, seeded=agg.seeded)


@dataclass
class PublicSet:
    """Public unlabeled inputs; ``labels`` (if known) are used only to report accuracies."""

    name: str
    inputs: list[tuple[str, str | None]]
    labels: list[int] | None = None


def pate_experiment(scorer: LabelScorer, template: PromptTemplate, private: Sequence[Demo],
                    test: Sequence[Demo], publics: Sequence[PublicSet], gnmax: GNMaxConfig, *,
                    n_teachers: int, shots: int = 1, calibrated: bool = True,
                    student_shots: int = 1, n_candidates: int = 10, val_fraction: float = 0.5,
                    max_val: int | None = None, seed: int = 0, noise_seed: int | None = None,
                    baselines: bool = True, top_token_only: bool = False,
                    progress: Progress | None = None) -> dict:
    """One row of Flocks Table 2: zero-shot, ensemble accuracy (ε=∞), best single private
    prompt (ε=∞) and, per public set, PromptPATE's student prompt and its test accuracy.

    Every public set is one release from the same teachers, so the reported ε composes all of
    them (and ``gnmax.epsilon_budget`` caps the composition). The report has two sections:
    ``private_release`` and ``diagnostics_not_private`` (see the module docstring). The ensemble
    accuracy and the choice of the best private prompt use the true labels of the first labelled
    public set (an IID sample disjoint from teachers and test); the privately labelled pipeline
    never sees them. ``top_token_only``: teachers vote with the top next token only (see
    :func:`teacher_votes`); students and baselines still read label probabilities.
    """
    for pub in publics:
        validate_inputs(len(private), n_teachers, shots, len(pub.inputs), scorer, template)
    if not test:
        raise PateInputError("the test set is empty")
    diag: dict = {"note": DIAGNOSTICS_NOTE, "epsilon": "infinite", "runs": {}}
    students: dict = {}
    if baselines:
        diag["zero_shot_acc"] = accuracy(scorer, template, [], test, calibrated=calibrated)
        if progress:
            progress(len(test) + int(calibrated))
    teachers = make_teachers(len(private), n_teachers, shots, seed)
    diag["teacher_indices"] = teachers  # indices into ``private`` (for the MIA on the student)
    demos = [[private[i] for i in t] for t in teachers]
    spent = np.zeros(len(gnmax.orders))
    rdps, rdps_indep, seeded = [], [], False
    for pub, nseed in zip(publics, release_noise_seeds(noise_seed, len(publics)), strict=True):
        votes, _ = teacher_votes(scorer, template, demos, pub.inputs, calibrated=calibrated,
                                 top_token_only=top_token_only, progress=progress)
        run = run_pate(scorer, template, private, pub.inputs, gnmax, n_teachers=n_teachers,
                       shots=shots, calibrated=calibrated, student_shots=student_shots,
                       n_candidates=n_candidates, val_fraction=val_fraction, max_val=max_val,
                       seed=seed, noise_seed=nseed, spent_rdp=spent, progress=progress,
                       votes=votes)
        spent = spent + run.gnmax.rdp
        rdps.append(run.gnmax.rdp)
        rdps_indep.append(run.rdp_data_independent)
        seeded = seeded or run.seeded
        students[pub.name] = {"public": pub.name, **run.release(template)}
        row = {"public": pub.name, **run.diagnostics()}
        if pub.labels is not None:
            y = np.array(pub.labels)
            row.update(_labelled_public_diagnostics(run, y, n_teachers))
            if baselines and "best_private" not in diag:
                diag["ensemble_acc"] = row["ensemble_acc_on_public"]
                diag.update(_best_private(scorer, template, demos, votes, y, test,
                                          calibrated=calibrated))
                if progress:
                    progress(len(test) + int(calibrated))
        row["student_test_acc"] = _student_test_acc(scorer, template, run, test,
                                                    calibrated=calibrated, progress=progress)
        diag["runs"][pub.name] = row
    private_release, diag["composed_order"] = _composed_release(
        rdps, rdps_indep, gnmax, n_teachers=n_teachers, seeded=seeded, students=students)
    return {"teachers": n_teachers, "shots": shots, "test_size": len(test), "seeded": seeded,
            "private_release": private_release, "diagnostics_not_private": diag}


def _labelled_public_diagnostics(run: PateRun, y: np.ndarray, n_teachers: int) -> dict:
    """Non-private accuracies of one release against its public set's true labels ``y`` (n,)."""
    rel = run.gnmax.labels >= 0
    return {
        "ensemble_acc_on_public": float(np.mean(run.counts.argmax(axis=1) == y)),
        "released_label_acc": float(np.mean(run.gnmax.labels[rel] == y[rel]))
        if rel.any() else None,
        "consensus_correct": float(np.mean(run.counts[np.arange(len(y)), y] / n_teachers)),
    }


def _best_private(scorer: LabelScorer, template: PromptTemplate, demos: Sequence[Sequence[Demo]],
                  votes: np.ndarray, y: np.ndarray, test: Sequence[Demo], *,
                  calibrated: bool) -> dict:
    """The ε=∞ baseline: the teacher prompt most accurate on the public labels ``y`` (n,) given
    the teachers' ``votes`` (teachers, n), with its test accuracy."""
    teacher_acc = (votes == y[None, :]).mean(axis=1)
    best = int(np.argmax(teacher_acc))
    return {
        "mean_teacher_acc_on_public": float(teacher_acc.mean()),
        "best_private": {
            "teacher": best, "public_acc": float(teacher_acc[best]),
            "test_acc": accuracy(scorer, template, demos[best], test, calibrated=calibrated)},
    }


def _student_test_acc(scorer: LabelScorer, template: PromptTemplate, run: PateRun,
                      test: Sequence[Demo], *, calibrated: bool,
                      progress: Progress | None) -> float | None:
    """The student prompt's test accuracy; None when the run selected no student."""
    if run.student is None:
        return None
    y_test = np.array([y for _, y, _ in test])
    p = prompt_probs(scorer, template, run.student.demos, [(t, q) for t, _, q in test],
                     calibrated=calibrated)
    if progress:
        progress(len(test) + int(calibrated))
    return float(np.mean(p.argmax(axis=1) == y_test))


def _composed_release(rdps: Sequence[np.ndarray], rdps_indep: Sequence[np.ndarray],
                      gnmax: GNMaxConfig, *, n_teachers: int, seeded: bool,
                      students: dict) -> tuple[dict, float]:
    """(the ``private_release`` section, the Rényi order of its ε) for all releases composed."""
    eps, order = compose_epsilon(rdps, gnmax.orders, gnmax.delta)
    eps_indep, _ = compose_epsilon(rdps_indep, gnmax.orders, gnmax.delta)
    private_release = {
        "note": PRIVATE_RELEASE_NOTE,
        "releases_composed": len(rdps), "teachers": n_teachers,
        "epsilon": eps,
        "accounting": "data-dependent" if gnmax.data_dependent else "data-independent",
        "epsilon_data_independent": eps_indep, "delta": gnmax.delta,
        "epsilon_budget": gnmax.epsilon_budget, "seeded": seeded,
        "students": students,
    }
    if seeded:
        private_release["warning"] = SEEDED_WARNING
    return private_release, order
