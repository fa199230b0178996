"""`rapt privatize`: dχ-privacy text-to-text on a file or a built-in dataset."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path

import typer

from rapt import numfmt
from rapt.cli._app import (
    TARGET_P_HELP,
    app,
    check_eta_options,
    echo_data_notes,
    echo_privacy,
    fail,
    load_backbone_or_fail,
    privacy_level,
    resolve_eta,
    warn_if_seeded,
)
from rapt.cli._by_kind import KindOptions, check_kind_options, kind_policy, with_defaults
from rapt.cli.options import (
    ETA,
    FREQUENT_RANK,
    MIN_P,
    OTHER_ETA,
    OTHER_P,
    PERSONAL_ETA,
    PERSONAL_P,
    PERSONAL_RANK,
    PROTECT,
    TARGET_EP,
    TARGET_P,
    TEXT_COLUMN,
    TEXT_PAIR_COLUMN,
    with_help,
)
from rapt.config import DEFAULT_PRIVATIZER_MODE
from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

_LINE_FORMATS = ("label-text", "text-at-label", "trec", "lines")


def _load(name: str, split: str, fmt: str | None, text_column: str | None,
          text_pair_column: str | None, limit: int | None = None):
    from rapt.data import DataError, load_dataset

    try:
        ds = load_dataset(name, split, text_column=text_column,
                          text_pair_column=text_pair_column, limit=limit, format=fmt)
    except DataError as e:
        fail(str(e))
    echo_data_notes(ds)
    return ds


def _resolve_format(name: str, fmt: str | None) -> str:
    from rapt.data import BUILTINS, format_for

    if name in BUILTINS:
        return BUILTINS[name].format
    return fmt or format_for(name) or ""


def _columns(name: str, text_column: str | None, pair_column: str | None,
             present: list[str]) -> tuple[str, str | None]:
    from rapt.data import BUILTINS

    if name in BUILTINS:
        text_column, pair_column = BUILTINS[name].columns[0], BUILTINS[name].columns[1]
    if text_column is None:
        text_column = next((c for c in ("text", "sentence") if c in present), None)
    if text_column is None or text_column not in present:
        fail(f"{name}: no text column {text_column!r} among {present}; pass --text-column")
    return text_column, pair_column


def _rewrite(src: Path, name: str, fmt: str, n_records: int, texts: list[str],
             pairs: list[str | None], text_column: str | None,
             pair_column: str | None) -> str:
    """The source file's content with each record's text (and pair text) replaced."""
    raw = src.read_text(encoding="utf-8-sig")
    out: list[str] = []
    k = 0
    if fmt in _LINE_FORMATS:
        for line in raw.splitlines():
            if not line.strip():
                out.append(line)
                continue
            if fmt == "text-at-label":  # the label follows the last '@'
                out.append(texts[k] + "@" + line.strip().rpartition("@")[2])
            else:
                prefix = "" if fmt == "lines" else line.strip().partition(" ")[0] + " "
                out.append(prefix + texts[k])
            k += 1
        body = "\n".join(out) + "\n"
    elif fmt == "tsv":
        lines = raw.splitlines()
        header = lines[0].split("\t")
        tcol, pcol = _columns(name, text_column, pair_column, header)
        ti = header.index(tcol)
        pi = header.index(pcol) if pcol in header else None
        out.append(lines[0])
        for line in lines[1:]:
            if not line.strip():
                out.append(line)
                continue
            fields = line.split("\t")
            fields[ti] = texts[k].replace("\t", " ")
            if pi is not None and pairs[k] is not None:
                fields[pi] = str(pairs[k]).replace("\t", " ")
            out.append("\t".join(fields))
            k += 1
        body = "\n".join(out) + "\n"
    elif fmt in ("csv", "trustpilot"):
        rows = list(csv.reader(io.StringIO(raw)))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if fmt == "csv":
            tcol, pcol = _columns(name, text_column, pair_column, rows[0])
            ti, pi = rows[0].index(tcol), (rows[0].index(pcol) if pcol in rows[0] else None)
            writer.writerow(rows[0])
            rows = rows[1:]
        else:
            ti, pi = 0, None
        for row in rows:
            if not row:
                continue
            row[ti] = texts[k]
            if pi is not None and pairs[k] is not None:
                row[pi] = str(pairs[k])
            writer.writerow(row)
            k += 1
        body = buf.getvalue()
    elif fmt == "jsonl":
        for line in raw.splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            tcol, pcol = _columns(name, text_column, pair_column, list(rec))
            rec[tcol] = texts[k]
            if pcol is not None and pcol in rec and pairs[k] is not None:
                rec[pcol] = pairs[k]
            out.append(json.dumps(rec, ensure_ascii=False))
            k += 1
        body = "\n".join(out) + "\n"
    else:
        fail(f"{src}: cannot write format {fmt!r}")
    if k != n_records:
        fail(f"{src}: read {n_records} records but found {k} when writing; output not written")
    return body



_PIECES_HELP = ("WordPiece vocabularies (minilm): join (a '##' piece glued to the word before "
                "it, as the tokenizer decodes; the text reads back as the released tokens, but "
                "a piece drawn at a word's position makes a non-word) | split (every piece a "
                "word of its own: readable, but not read back as released). Spacing never "
                "depends on the original text. Uncased vocabularies write lower-case text")


def _threads_for_load() -> int:
    """Threads for the nearest-neighbour search. torch starts one per core; where other
    processes hold cores, each parallel step waits for its slowest thread: on 2 shared cores,
    1,000-1,400 tokens/s with 2 threads against ~10,000 with 1 while another process held a
    core (15,000-17,000 with 2 when both were free). Unless OMP_NUM_THREADS says otherwise,
    use the cores the 1-minute load average leaves free, at least one."""
    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        free = max(1, (os.cpu_count() or 1) - round(os.getloadavg()[0]))
        torch.set_num_threads(max(1, min(torch.get_num_threads(), free)))
    return torch.get_num_threads()


def _check_options(mode: str, chunk_size: int, pieces: str) -> None:
    if mode not in ("exact", "fast", "annoy"):
        fail(f"--mode must be exact, fast or annoy, got {mode!r}")
    if chunk_size < 1:
        fail(f"--chunk-size must be >= 1, got {chunk_size}")
    if pieces not in ("join", "split"):
        fail(f"--pieces must be join or split, got {pieces!r}")


_TARGET_P_HELP = (TARGET_P_HELP + f"; default {DEFAULT_PROTECTED_P:g} for the protected tokens, "
                  f"{DEFAULT_TARGET_P:g} under --protect all, when no --eta / --target-ep is "
                  "given (levels the weak-privacy rule does not flag)")


@app.command()
def privatize(
    input: str = typer.Argument(..., help="input file, or a built-in dataset name"),
    output: Path = typer.Argument(..., help="privatized file, written in the input's format"),
    eta: float | None = ETA,
    target_p: float | None = with_help(TARGET_P, _TARGET_P_HELP),
    target_ep: float | None = TARGET_EP, min_p: float = MIN_P,
    protect: str | None = PROTECT, frequent_rank: int = FREQUENT_RANK,
    other_p: float | None = OTHER_P, other_eta: float | None = OTHER_ETA,
    personal_p: float | None = PERSONAL_P, personal_eta: float | None = PERSONAL_ETA,
    personal_rank: int | None = PERSONAL_RANK,
    backbone: str = typer.Option("minilm", "--backbone", "-b",
                                 help="embedding model: minilm, mpnet, smollm2-135m, hub id "
                                      "or path"),
    mode: str = typer.Option(DEFAULT_PRIVATIZER_MODE, "--mode",
                             help="nearest-neighbour search: exact, fast (certified exact), "
                             "annoy (approximate reference)"),
    seed: int | None = typer.Option(
        None, "--noise-seed", "--seed", help="seed the privacy noise: repeatable, but no "
        "guarantee (seeded: true); default: OS entropy"),
    fmt: str = typer.Option("auto", "--format",
                            help="auto (from the extension), label-text, lines, trec, tsv, csv, "
                            "jsonl, trustpilot"),
    split: str = typer.Option("train", "--split", help="split of a built-in dataset"),
    text_column: str | None = TEXT_COLUMN,
    text_pair_column: str | None = TEXT_PAIR_COLUMN,
    all_tokens: bool = typer.Option(
        False, "--all-tokens", help="allow every vocabulary row as output (by default special "
        "and [unused] tokens are excluded)"),
    chunk_size: int = typer.Option(4096, "--chunk-size", help="tokens per step (memory)"),
    pieces: str = typer.Option("join", "--pieces", help=_PIECES_HELP),
    json_report: bool = typer.Option(False, "--json-report",
                                     help="print the report as one JSON line at the end"),
) -> None:
    """Privatize a text file with dχ-privacy: each token -> nearest token to its noised embedding.

    Prints η, the measured replacement probability P, the nearest-neighbour inversion success,
    the shipped attack table's strongest attacker at that η and the throughput."""
    check_eta_options(eta, target_p, target_ep)
    check_kind_options(kinds := with_defaults(KindOptions(
        protect, frequent_rank, other_p, other_eta, personal_p, personal_eta, personal_rank)))
    _check_options(mode, chunk_size, pieces)
    format_opt = None if fmt == "auto" else fmt
    ds = _load(input, split, format_opt, text_column, text_pair_column)
    src = Path(ds.source)
    if output.resolve() == src.resolve():
        fail(f"{output}: output would overwrite the input")
    # the loader's format: a .txt of 'sentence@label' lines is read (and written) as such
    fmt_used = ds.report.get("format") or _resolve_format(input, format_opt)
    threads = _threads_for_load()
    bb = load_backbone_or_fail(backbone, embeddings_only=True)  # the mechanism needs no model
    target_p = privacy_level(eta, target_p, target_ep, False, clear=None, can_be_clear=False,
                             protect=kinds.protect)
    eta = resolve_eta(bb, eta, target_p, target_ep)[0]
    if target_p is not None:
        typer.echo(f"calibrated η = {numfmt.eta(eta)} for target P = {target_p} on rapt's public "
                   "text sample (P on this input is measured below)", err=True)
    warn_if_seeded(seed)
    priv, res, out_texts, out_pairs = _privatize_dataset(
        bb, ds, eta, seed=seed, mode=mode, chunk_size=chunk_size, all_tokens=all_tokens,
        pieces=pieces, policy=(policy := kind_policy(bb, eta, kinds)))
    # The loader's columns: it may have detected a sentence pair the flags did not name.
    body = _rewrite(src, input, fmt_used, len(ds), out_texts, out_pairs,
                    ds.report.get("text_column") or text_column,
                    ds.report.get("text_pair_column") or text_pair_column)
    _write_output(output, body)
    report = _privatize_report(res, priv, target_p=target_p, src=src, output=output,
                               fmt=fmt_used, examples=len(ds), eta=eta, mode=mode,
                               backbone=backbone, seed=seed, threads=threads, policy=policy)
    report["by_kind"] = policy.record(eta) if policy is not None else None
    typer.echo(f"privatized {len(ds)} records, {report['tokens']} tokens -> {output}")
    typer.echo(f"η = {numfmt.eta(eta)}  P (replaced tokens) = {numfmt.p(res.p)}  throughput = "
               f"{report['tokens_per_s']:,.0f} tokens/s ({mode} search, {threads} threads)")
    echo_privacy(report["privacy"], backbone=backbone, min_p=min_p, what="file")
    if all_tokens or mode == "annoy":
        typer.echo("note: the attack table was measured with the tokenizer's real tokens as "
                   "outputs and exact search; --all-tokens / --mode annoy change the mechanism",
                   err=True)
    if json_report:
        typer.echo(json.dumps(report))


def _write_output(output: Path, body: str) -> None:
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(body, encoding="utf-8")
    except OSError as e:
        fail(f"{output}: cannot write: {e}")


def _privatize_dataset(bb, ds, eta: float, *, seed: int | None, mode: str, chunk_size: int,
                       all_tokens: bool, pieces: str = "join", policy=None):
    """Privatize every text (and pair text) of ``ds`` at ``eta`` with a bar on stderr; by kind
    of token under ``policy`` (a KindPolicy, or None: uniform).

    Returns (privatizer, detailed result, private texts, private pair texts — None where the
    record has no pair)."""
    from rapt.privacy.mechanism import (
        Privatizer,
        candidate_ids_from_tokenizer,
        privatize_texts_detailed,
        tokenize_texts,
    )
    from rapt.progress import progress_bar

    emb = bb.embeddings.detach()
    cand = None if all_tokens else candidate_ids_from_tokenizer(bb.tokenizer, emb.shape[0])
    texts = ds.texts
    pairs = ds.text_pairs
    has_pairs = any(p is not None for p in pairs)
    all_texts = texts + ([p or "" for p in pairs] if has_pairs else [])
    priv = Privatizer(emb, eta, special_ids=bb.special_ids, candidate_ids=cand, mode=mode,
                      chunk_size=chunk_size, seed=seed)
    n_tok = sum(len(r) for r in tokenize_texts(all_texts, bb.tokenizer))
    scales = clear = classes = None
    if policy is not None:
        from rapt.privacy.by_kind import row_noise
        from rapt.privacy.personal_data import PersonalDataDetector

        scales, clear, classes = row_noise(tokenize_texts(all_texts, bb.tokenizer), all_texts,
                                           None,
                                     bb.tokenizer, policy, eta, special=set(
                                         int(i) for i in bb.special_ids), detector=(
                                         PersonalDataDetector()))
    with progress_bar(total=n_tok, unit="token", desc="privatize") as bar:
        res = privatize_texts_detailed(all_texts, bb.tokenizer, priv, progress=bar.update,
                                       pieces=pieces, eta_scale=scales, passthrough=clear)
    out_texts = res.texts[: len(texts)]
    out_pairs: list[str | None] = (
        [t if p is not None else None for t, p in zip(res.texts[len(texts):], pairs,
                                                       strict=True)]
        if has_pairs else [None] * len(texts))
    res.classes = classes  # each token's class under ``policy`` (per kind privacy figures)
    return priv, res, out_texts, out_pairs


def _privatize_report(res, priv, *, target_p: float | None, src: Path, output: Path, fmt: str,
                      examples: int, eta: float, mode: str, backbone: str,
                      seed: int | None, threads: int | None = None, policy=None) -> dict:
    """The run's report (``--json-report``), with the measured privacy under "privacy" (per
    kind of token, and judged on the protected kinds, under a by-kind ``policy``)."""
    from rapt.privacy.attack_table import strongest_at
    from rapt.privacy.mechanism import privacy_report

    st = res.stats
    classes = getattr(res, "classes", None)
    privacy = privacy_report(res.original_ids, res.private_ids, priv, target_p=target_p,
                             classes=classes, frequent_rank=getattr(policy, "frequent_rank",
                                                                    None))
    if policy is not None and not policy.uniform:
        privacy["protected_kinds"] = policy.protected_kinds(eta)
    report = {"input": str(src), "output": str(output), "format": fmt,
              "examples": examples, "tokens": int(st.get("tokens", 0)), "eta": eta,
              "p": res.p, "inversion_success": privacy["inversion_success"], "mode": mode,
              "backbone": backbone, "seed": seed,
              "seeded": seed is not None, "calibrated_on": "public sample" if target_p else None,
              "seconds": st.get("seconds", 0.0), "tokens_per_s": st.get("tokens_per_s", 0.0),
              "threads": threads,
              "privacy": privacy,
              "attack_table": dataclasses.asdict(strongest_at(backbone, eta))}
    if mode == "fast":
        report["fast_search"] = dict(priv.index.stats)
    return report
