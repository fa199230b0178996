"""P and attack success against η for the packaged backbones, from the shipped attack table.

Reads ``src/rapt/resources/attack_table.json`` (written by ``bench_attack_table.py``; no number
is measured here) and writes ``benchmarks/results/privacy_vs_eta.png``: per backbone, the
measured replacement probability P and every attacker's token recovery at each grid η, the
empirical privacy (1 − the best recovery of the attackers run: an upper bound) it implies,
the weak-privacy threshold of :mod:`rapt.privacy.rule` and the default level the commands
privatize at.

    python -m benchmarks.plot_privacy_vs_eta
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rapt.privacy.attack_table import load_table
from rapt.privacy.rule import DEFAULT_MIN_P, DEFAULT_TARGET_P

OUT = Path(__file__).resolve().parent / "results" / "privacy_vs_eta.png"


def plot(table: dict):
    """One panel per backbone: P, each attacker's recovery and the empirical privacy vs η."""
    names = list(table["backbones"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        entry = table["backbones"][name]
        pts = entry["points"]
        etas = [pt["eta"] for pt in pts]
        ax.plot(etas, [pt["p"] for pt in pts], "o-", color="black", label="P (tokens replaced)")
        for key, info in entry["attackers"].items():
            ax.plot(etas, [pt["recovery"].get(key, {}).get("all") for pt in pts], "s--",
                    ms=3, label=f"{info.get('name', key)}: tokens recovered")
        ep = [1 - max(r["all"] for r in pt["recovery"].values()) for pt in pts]
        ax.plot(etas, ep, "-", color="tab:green", lw=2.5, alpha=0.6,
                label="empirical privacy (1 − best attacker run; upper bound)")
        ax.axhline(DEFAULT_MIN_P, color="tab:red", lw=1, ls=":",
                   label=f"weak below {DEFAULT_MIN_P:g} (--min-p)")
        ax.axhline(DEFAULT_TARGET_P, color="tab:blue", lw=1, ls=":",
                   label=f"default level P {DEFAULT_TARGET_P:g}")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks([round(e) for e in etas[::2]])
        ax.set_xlabel("η (log scale; smaller = more noise)")
        ax.set_ylim(0, 1)
        ax.set_title(f"{name} ({entry['embeddings'][0]:,} tokens, d = {entry['embeddings'][1]})")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of text tokens")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3)
    prov = table.get("provenance", {})
    fig.suptitle(f"dχ text-to-text: P and attack success vs η (shipped attack table, "
                 f"{prov.get('date', '')}; public text)", fontsize=10)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=None, help="attack table JSON (default: the shipped one)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    fig = plot(load_table(args.table))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
