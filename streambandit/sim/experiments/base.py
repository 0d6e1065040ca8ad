"""What an experiment returns, and how its results are written: CSV, PNG and a Markdown summary.

Each experiment is a module in this package with ``NAME``, ``total_rounds(size=, seeds=)`` and
``run(size=, seeds=, progress=)`` returning an :class:`ExperimentResult`. ``size`` is ``"tiny"``
(the test suite's smoke test), ``"default"`` (about two minutes on two cores) or ``"full"`` (the
paper's sizes).
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

__all__ = ["Curve", "ExperimentResult", "SIZES", "write_result"]

SIZES = ("tiny", "default", "full")


@dataclasses.dataclass
class Curve:
    """One learner on one setting and seed: cumulative pseudo-regret and wall time per round."""

    setting: str
    learner: str
    seed: int
    regret: np.ndarray  # (T,) cumulative pseudo-regret
    seconds: np.ndarray  # (T,) cumulative wall time of select + update
    extra: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # other per-round series


@dataclasses.dataclass
class ExperimentResult:
    name: str
    curves: list[Curve]
    summary: str  # Markdown: the paper's claim, our figures, where they agree and where not
    choices: list[str]  # settings chosen where the paper is silent


def write_result(result: ExperimentResult, out_dir: str | Path, *, size: str) -> list[Path]:
    """``NAME.csv`` (every round of every curve), ``NAME.md`` and, with matplotlib, ``NAME.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        _write_csv(result, out / f"{result.name}.csv"),
        _write_md(result, out / f"{result.name}.md", size),
    ]
    png = _write_png(result, out / f"{result.name}.png")
    if png is not None:
        written.append(png)
    return written


def _write_csv(result: ExperimentResult, path: Path) -> Path:
    extras = sorted({k for c in result.curves for k in c.extra})
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["setting", "learner", "seed", "round", "regret", "seconds", *extras])
        for c in result.curves:
            cols = [c.extra.get(k) for k in extras]
            for t in range(len(c.regret)):
                w.writerow(
                    [
                        c.setting,
                        c.learner,
                        c.seed,
                        t + 1,
                        repr(float(c.regret[t])),
                        repr(float(c.seconds[t])),
                        *("" if v is None else repr(float(v[t])) for v in cols),
                    ]
                )
    return path


def _write_md(result: ExperimentResult, path: Path, size: str) -> Path:
    lines = [
        f"# `streambandit simulate {result.name}` ({size} size)",
        "",
        result.summary.strip(),
        "",
    ]
    if result.choices:
        lines += (
            ["## Settings we chose where the paper is silent", ""]
            + [f"- {c}" for c in result.choices]
            + [""]
        )
    path.write_text("\n".join(lines))
    return path


def _groups(result: ExperimentResult) -> dict[str, dict[str, list[Curve]]]:
    out: dict[str, dict[str, list[Curve]]] = {}
    for c in result.curves:
        out.setdefault(c.setting, {}).setdefault(c.learner, []).append(c)
    return out


def _write_png(result: ExperimentResult, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = _groups(result)
    fig, axes = plt.subplots(2, len(groups), figsize=(4.5 * len(groups), 7), squeeze=False)
    for col, (setting, learners) in enumerate(groups.items()):
        for learner, curves in learners.items():
            t_len = min(len(c.regret) for c in curves)
            regret = np.stack([c.regret[:t_len] for c in curves])
            rounds = np.arange(1, t_len + 1)
            mean, sd = regret.mean(axis=0), regret.std(axis=0)
            (line,) = axes[0, col].plot(rounds, mean, label=learner)
            axes[0, col].fill_between(
                rounds, mean - sd, mean + sd, color=line.get_color(), alpha=0.2
            )
            # Time per round, smoothed over windows of ~1% of the run (median over seeds).
            per_round = np.median(
                np.stack([np.diff(c.seconds[:t_len], prepend=0.0) for c in curves]), axis=0
            )
            w = max(1, t_len // 100)
            smooth = np.convolve(per_round, np.ones(w) / w, mode="valid") * 1e3
            axes[1, col].plot(
                np.arange(w, t_len + 1), smooth, color=line.get_color(), label=learner
            )
        axes[0, col].set_title(setting)
        axes[0, col].set_ylabel("cumulative regret (mean, band: +-1 sd over seeds)")
        axes[1, col].set_ylabel("ms per round (select + update)")
        axes[1, col].set_yscale("log")
        axes[1, col].set_xlabel("round")
        axes[0, col].legend(fontsize=8)
    fig.suptitle(f"streambandit simulate {result.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
