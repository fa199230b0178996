"""The headline speed figures of the package in one table (issue 31 item 5).

Reads the committed results under ``benchmarks/results/`` (it measures nothing itself) and
writes ``benchmarks/results/speed.md``: one row per figure with the machine and load average it
was measured under, the results file and the command that produced it. A source that is
missing gives a row that says so.

    python -m benchmarks.speed_table
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from benchmarks._common import RESULTS

Row = dict[str, str]


def _load(name: str) -> dict | None:
    p = RESULTS / name
    return json.loads(p.read_text()) if p.exists() else None


def _machine(m: dict, threads_key: str = "torch_threads") -> tuple[str, str]:
    """('Linux x86_64, 2 CPUs, 1 thread(s)', 'load 7.25 → 8.54') from a results file's machine."""
    threads = next((m[k] for k in (threads_key, "torch_threads", "threads", "omp_threads",
                                   "omp_num_threads", "server_omp_threads") if m.get(k)), "?")
    plat = "x86_64" if "x86_64" in m.get("platform", "") else m.get("platform", "?")
    start = m.get("loadavg_start") or m.get("load_avg_start") or ["?"]
    end = m.get("loadavg_end") or m.get("load_avg_end")
    load = f"{start[0]:.2f}" if isinstance(start[0], float) else str(start[0])
    if end:
        load += f" → {end[0]:.2f}"
    return f"Linux {plat}, {m.get('cpu_count', '?')} CPUs, {threads} thread(s)", load


def _row(what: str, figure: str, doc: dict, source: str, machine: dict | None = None) -> Row:
    mach, load = _machine(machine if machine is not None else doc.get("machine", {}))
    cmd = re.sub(r"^\S*/python3?(\.\d+)? ", "python ", doc.get("command", ""))
    return {"what": what, "figure": figure, "machine": mach, "load": load, "source": source,
            "command": cmd}


def privatization() -> list[Row]:
    d = _load("privatize.json")
    if d is None:
        return []
    t = next(r for r in d["throughput"] if r["target_p"] == 0.5)
    fig = (f"{t['fast']['tokens_per_s']:,.0f} tokens/s certified-exact fast search, "
           f"{t['exact']['tokens_per_s']:,.0f} exact ({d['vocabulary']['rows']:,}-token "
           f"MiniLM vocabulary, P ≈ 0.5; best of 5 runs)")
    rows = [_row("privatization (dχ, nearest neighbour)", fig, d, "privatize.json")]
    c = _load("default_cost.json")
    if c is not None:
        r = c["result"]
        fig = (f"{r['rows']:,} SST-2 sentences: {r['default_total_s']:.1f} s by kind (rapt's "
               f"default; personal data {r['personal_data_s']:.1f} s, "
               f"{r['ms_per_row_personal_data']:.1f} ms a sentence) vs "
               f"{r['privatize_uniform_s']:.1f} s uniform; Presidio's load "
               f"{r['presidio_load_s']:.1f} s once")
        rows.append(_row("privatization, the default policy", fig, c, "default_cost.json"))
    return rows


def tuning() -> list[Row]:
    d = _load("dpsgd_speed.json")
    if d is None:
        return []
    s, r = d["settings"], d["results"]
    step = (f"{r['prompt']['median_s']['nonprivate']:.2f} s per step (prompt), "
            f"{r['prefix']['median_s']['nonprivate']:.2f} s (prefix); MiniLM, batch "
            f"{s['physical_batch']} × {s['length']} tokens, {s['virtual_tokens']} virtual tokens")
    ratio = (f"DP / non-private step time {r['prompt']['ratio_dp_over_nonprivate']:.2f} "
             f"(prompt), {r['prefix']['ratio_dp_over_nonprivate']:.2f} (prefix); goal ≤ 1.15")
    return [_row("tuning step (fp32)", step, d, "dpsgd_speed.json"),
            _row("PromptDPSGD step ratio", ratio, d, "dpsgd_speed.json")]


def precision() -> list[Row]:
    d = _load("precision.json")
    if d is None:
        return [{"what": "bf16 autocast",
                 "figure": "not measured yet (python -m benchmarks.bench_precision)",
                 "machine": "", "load": "", "source": "", "command": ""}]
    out = []
    steps = [r for r in d.get("step", []) if not r.get("predict")]
    if steps:
        fig = ", ".join(f"{r['method']}{' DP' if r['dp'] else ''} {r['speedup']:.2f}×"
                        for r in steps)
        out.append(_row("bf16 autocast, training step", f"fp32 / bf16 step time: {fig} "
                        f"(B {steps[0]['batch']} × L {steps[0]['length']})", d, "precision.json"))
    a = d.get("accuracy")
    if a:
        p = a["paired_bf16_minus_fp32"]
        out.append(_row("bf16 autocast, accuracy", f"bf16 − fp32 = {100 * p['mean_diff']:+.1f} ± "
                        f"{100 * p['ci95']:.1f} points over {p['n']} paired seeds (RAPT setting, "
                        f"P ≈ {a['settings']['target_p']}); {a['speedup']:.2f}× per step",
                        d, "precision.json"))
    return out


def sap_http() -> list[Row]:
    d = _load("sap_service.json")
    if d is None:
        return []
    lat = d["latency"]
    fig = (f"remote / local step time − 1: {100 * lat['frozen']['overhead_median']:+.0f} % "
           f"(frozen bottom), {100 * lat['unfrozen']['overhead_median']:+.0f} % (unfrozen); "
           f"split after {lat['frozen']['split_layer']} blocks, batch {d['batch_size']}; goal "
           f"≤ {100 * d['goal_overhead']:.0f} %")
    return [_row("SAP over HTTP", fig, d, "sap_service.json")]


def mixed() -> list[Row]:
    d = _load("mixed.json")
    if d is None:
        return []
    at64 = {r["method"]: r for r in d["forward"] if r["prompts"] == 64}
    fig = ", ".join(f"{m} {r['mixed_over_per_prompt']:.2f}×" for m, r in at64.items())
    svc = d.get("service", {})
    rows = [_row("mixed serving, 64 prompts in one pass", f"mixed / per-prompt throughput: {fig} "
                 f"({d['settings']['rows']} rows); goal ≥ 4×", d, "mixed.json")]
    if svc:
        rows.append(_row("service micro-batching", f"{svc['after']['requests_per_s']} vs "
                         f"{svc['before']['requests_per_s']} requests/s "
                         f"({svc['speedup_requests_per_s']}×; {svc['prompts']} prompts, "
                         f"{svc['after']['threads']} client threads)", d, "mixed.json"))
    return rows


def gpu() -> list[Row]:
    """The lent GPU's figures (issue 31 item 4): bench_gpu.py's parts and bench_mixed.py on
    CUDA. Their machine is the GPU, not this machine's CPUs."""
    rows = []
    d = _load("gpu_privatize.json")
    if d is not None:
        at = {(r["target_p"], r["mode"]): r for r in d["privatize"]["rows"]}
        r, rf = at[(0.5, "exact")], at[(0.5, "fast")]
        differ = sum(x["cpu_differ"] or 0 for x in d["privatize"]["rows"])
        fig = (f"{r['os_entropy_tokens_per_s']:,.0f} tokens/s end to end with OS entropy "
               f"(exact search; fast {rf['os_entropy_tokens_per_s']:,.0f}), search alone "
               f"{r['search_only_tokens_per_s']:,.0f}, noise alone "
               f"{r['noise_only_tokens_per_s']:,.0f} (P ≈ 0.5); seeded output "
               f"{'identical to' if differ == 0 else 'DIFFERS from'} the CPU's; goal ≥ 1M "
               "end to end")
        rows.append(_gpu_row("privatization on a GPU", fig, d, "gpu_privatize.json"))
    d = _load("gpu_tune.json")
    if d is not None:
        for name, res in d["tune"]["backbones"].items():
            fig = "; ".join(
                f"{m} {res[f'{m} fp32']['examples_per_s']:,.0f} fp32 / "
                f"{res[f'{m} bf16']['examples_per_s']:,.0f} bf16"
                for m in ("prompt", "prefix", "lora")
                if all("examples_per_s" in res.get(f"{m} {q}", {}) for q in ("fp32", "bf16")))
            rows.append(_gpu_row("tuning examples/s on a GPU",
                                 f"{Path(name).name}, batch 32: {fig or 'no run finished'}", d,
                                 "gpu_tune.json"))
    d = _load("mixed_gpu.json")
    if d is not None:
        at64 = {r["method"]: r for r in d["forward"] if r["prompts"] == 64}
        fig = ", ".join(f"{m} {r['mixed_over_per_prompt']:.2f}×" for m, r in at64.items())
        row = _row("mixed serving on a GPU, 64 prompts", f"mixed / per-prompt throughput: "
                   f"{fig}; goal ≥ 4×", d, "mixed_gpu.json")
        row["machine"] = f"{d['machine'].get('gpu')}, {d['machine']['cpu_count']} CPUs"
        rows.append(row)
    return rows


def _gpu_row(what: str, figure: str, d: dict, source: str) -> Row:
    env = d["environment"]
    row = _row(what, figure, d, source, {"platform": env["platform"],
                                         "cpu_count": env["cpu_count"]})
    row["machine"] = f"{env.get('gpu', env['device'])}, {env['cpu_count']} CPUs"
    row["load"] = "not recorded"
    return row


def pate() -> list[Row]:
    d = _load("pate_speed.json")
    if d is None:
        return []
    sp = [r["speedup"] for r in d["runs"]]
    fig = (f"KV-cached teacher votes {min(sp):.1f}–{max(sp):.1f}× the uncached rate "
           f"({d['backbone']}, {len(sp)} task × shots cells)")
    return [_row("PATE teacher cache", fig, d, "pate_speed.json")]


def _verdict_word(v) -> str:
    """The paper demo's verdict ("reconstruction made no significant difference here: ...") in
    a few words; the default demo's (one per arm: the mode `rapt predict` would use)."""
    if isinstance(v, dict):
        modes = (("fuses by default", "fused"), ("uses it alone by default and sends nothing",
                                                "local"), ("uses it alone by default", "remote"))
        return ", ".join(f"{arm} → " + next((m for phrase, m in modes if phrase in t), "?")
                         for arm, t in v.items())
    return (v or "").split(" here:")[0].removeprefix("reconstruction ")


def wallclock() -> list[Row]:
    d = _load("wallclock.json") or {}
    rows = []
    for name, recs in sorted(d.items()):
        r = recs[-1]
        if "counts" in r:
            fig = f"{r['seconds'] / 60:.1f} min ({r['summary']})"
            what = f"test suite ({name})"
        else:
            secs = [x["seconds"] for x in recs]
            stages = ", ".join(f"{k} {v:.0f} s" for k, v in r.get("stage_seconds", {}).items()
                               if v >= 1)
            words = [_verdict_word(x.get("verdict")) for x in recs]
            fig = (f"{min(secs) / 60:.1f}–{max(secs) / 60:.1f} min over {len(recs)} run(s) "
                   f"(last: {stages}); verdicts: {'; '.join(words)}" if len(recs) > 1 else
                   f"{r['seconds'] / 60:.1f} min ({stages}); verdict: {words[0]}")
            what = f"`rapt demo` ({name})"
        rows.append(_row(what, fig, r, "wallclock.json", r["machine"]))
    for what, kind in (("test suite", "test"), ("`rapt demo`", "demo")):
        if not any(k.startswith(kind) for k in d):
            rows.append({"what": what, "figure": "not measured yet (python -m "
                         f"benchmarks.bench_wallclock --what {kind})", "machine": "", "load": "",
                         "source": "", "command": ""})
    return rows


SECTIONS: list[Callable[[], list[Row]]] = [privatization, tuning, precision, sap_http, mixed,
                                           pate, wallclock, gpu]


def table() -> str:
    rows = [r for f in SECTIONS for r in f()]
    lines = ["# Speed figures", "",
             "Regenerate: `python -m benchmarks.speed_table` (reads benchmarks/results/*.json; "
             "each figure's own command is in the last column). Load is the 1-minute load "
             "average at the start (→ end) of the run: the machines are shared, and a load "
             "above the CPU count means the figure is slower than on a quiet machine.", "",
             "| what | figure | machine | load | source | command |", "|---|---|---|---|---|---|"]
    for r in rows:
        cmd = f"`{r['command']}`" if r["command"] else ""
        lines.append(f"| {r['what']} | {r['figure']} | {r['machine']} | {r['load']} | "
                     f"{r['source']} | {cmd} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    text = table()
    (RESULTS / "speed.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
