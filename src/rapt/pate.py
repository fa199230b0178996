"""PromptPATE (Flocks §4.2): private discrete prompts through an ensemble of prompted teachers.

1. Teachers: disjoint k-shot prompts from the private set (each private example in at most one
   teacher, so one example changes at most one vote).
2. Each teacher votes on public unlabeled inputs with its contextually calibrated prediction
   (Zhao et al. 2021: p_cal ∝ p / p("N/A")).
3. Confident-GNMax (``rapt.gnmax``) releases noisy labels, with RDP accounting and a budget stop.
4. Student: candidate k-shot prompts built from released (public input, noisy label) pairs; the
   best on a held-out part of the released pairs is the private prompt. Private data is never
   used for selection.

Everything here works on in-memory examples and a :class:`rapt.llm.LabelScorer`; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rapt.gnmax import ConfidentGNMax, GNMaxConfig, GNMaxResult, vote_counts
from rapt.llm import LabelScorer, normalize


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


# -- the whole pipeline --------------------------------------------------------------------

@dataclass
class PateRun:
    """Outcome of one PromptPATE labelling + student selection."""

    teachers: list[list[int]]
    votes: np.ndarray  # (E, Q)
    counts: np.ndarray  # (Q, C)
    gnmax: GNMaxResult
    released: list[Demo]
    student: StudentResult | None
    consensus: np.ndarray  # (Q,) fraction of teachers voting for the plurality label

    def summary(self) -> dict:
        g = self.gnmax
        return {
            "teachers": len(self.teachers), "queries": int(self.counts.shape[0]),
            "queried": g.queried, "answered": int(g.answered.sum()),
            "released": len(self.released), "epsilon": g.epsilon, "order": g.order,
            "stopped_by_budget": g.stopped_by_budget,
            "mean_consensus": float(self.consensus.mean()) if len(self.consensus) else None,
            "student_val_accuracy": self.student.val_accuracy if self.student else None,
            "student_demos": [list(d) for d in self.student.demos] if self.student else None,
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
             seed: int = 0, progress: Progress | None = None,
             votes: np.ndarray | None = None) -> PateRun:
    """Teachers vote on ``public``; Confident-GNMax labels; a student prompt is selected.

    ``votes`` (E, Q) can be passed to reuse teacher votes (e.g. several noise seeds).
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
    res = ConfidentGNMax(gnmax, seed=seed).run(counts)
    released = [(public[i][0], int(res.labels[i]), public[i][1])
                for i in range(len(public)) if res.labels[i] >= 0]
    student = None
    if len(released) >= student_shots + 1:
        student = select_student(scorer, template, released, shots=student_shots,
                                 n_candidates=n_candidates, val_fraction=val_fraction,
                                 max_val=max_val, calibrated=calibrated, seed=seed,
                                 progress=progress)
    return PateRun(teachers=teachers, votes=votes, counts=counts, gnmax=res, released=released,
                   student=student, consensus=consensus)


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
                    max_val: int | None = None, seed: int = 0, baselines: bool = True,
                    top_token_only: bool = False, progress: Progress | None = None) -> dict:
    """One row of Flocks Table 2: zero-shot, ensemble accuracy (ε=∞), best single private
    prompt (ε=∞) and, per public set, PromptPATE's ε and student test accuracy.

    The ensemble accuracy and the choice of the best private prompt use the true labels of the
    first labelled public set (an IID sample disjoint from teachers and test); the privately
    labelled pipeline never sees them. ``top_token_only``: teachers vote with the top next token
    only (see :func:`teacher_votes`); students and baselines still read label probabilities.
    """
    for pub in publics:
        validate_inputs(len(private), n_teachers, shots, len(pub.inputs), scorer, template)
    if not test:
        raise PateInputError("the test set is empty")
    y_test = np.array([y for _, y, _ in test])
    out: dict = {"teachers": n_teachers, "shots": shots, "test_size": len(test), "runs": {}}
    test_inputs = [(t, p) for t, _, p in test]
    if baselines:
        out["zero_shot_acc"] = accuracy(scorer, template, [], test, calibrated=calibrated)
        if progress:
            progress(len(test) + int(calibrated))
    teachers = make_teachers(len(private), n_teachers, shots, seed)
    out["teacher_indices"] = teachers  # indices into ``private`` (for the MIA on the student)
    demos = [[private[i] for i in t] for t in teachers]
    for pub in publics:
        votes, _ = teacher_votes(scorer, template, demos, pub.inputs, calibrated=calibrated,
                                 top_token_only=top_token_only, progress=progress)
        run = run_pate(scorer, template, private, pub.inputs, gnmax, n_teachers=n_teachers,
                       shots=shots, calibrated=calibrated, student_shots=student_shots,
                       n_candidates=n_candidates, val_fraction=val_fraction, max_val=max_val,
                       seed=seed, progress=progress, votes=votes)
        row = run.summary()
        row["public"] = pub.name
        row["epsilon_curve"] = run.gnmax.epsilon_curve.tolist()
        if pub.labels is not None:
            y = np.array(pub.labels)
            row["ensemble_acc_on_public"] = float(np.mean(run.counts.argmax(axis=1) == y))
            rel = run.gnmax.labels >= 0
            row["released_label_acc"] = float(np.mean(run.gnmax.labels[rel] == y[rel])) \
                if rel.any() else None
            row["consensus_correct"] = float(np.mean(
                run.counts[np.arange(len(y)), y] / n_teachers))
            if baselines and "best_private" not in out:
                out["ensemble_acc"] = row["ensemble_acc_on_public"]
                teacher_acc = (votes == y[None, :]).mean(axis=1)
                best = int(np.argmax(teacher_acc))
                out["mean_teacher_acc_on_public"] = float(teacher_acc.mean())
                out["best_private"] = {
                    "teacher": best, "public_acc": float(teacher_acc[best]),
                    "test_acc": accuracy(scorer, template, demos[best], test,
                                         calibrated=calibrated)}
                if progress:
                    progress(len(test) + int(calibrated))
        if run.student is not None:
            p = prompt_probs(scorer, template, run.student.demos, test_inputs,
                             calibrated=calibrated)
            row["student_test_acc"] = float(np.mean(p.argmax(axis=1) == y_test))
            if progress:
                progress(len(test) + int(calibrated))
        else:
            row["student_test_acc"] = None
        out["runs"][pub.name] = row
    return out
