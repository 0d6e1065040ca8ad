"""The report of a replay: Markdown, a JSON document and (with matplotlib) a PNG of the running
estimates with their final intervals and the logging policy's value.

A replay of several targets reports them side by side (their snips, dr and, for slates, cascade
estimates), then each target's full table, its estimates per model key (in the Markdown for
the first :data:`KEYS_SHOWN` keys, in the JSON for every key that has them) and, for slates, per
position (the slot, 0 at the top)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from streambandit.replay.estimators import Estimate
from streambandit.replay.figure_process import FigureProcess
from streambandit.replay.paths import ExpectedValue
from streambandit.replay.runner import KINDS, KeyEstimates, ReplayResult

__all__ = ["to_json", "to_markdown", "plot", "write_report", "KEYS_SHOWN"]

KEYS_SHOWN = 20

_ABOUT = {
    "replay": "mean reward where the target chose the logged arm (Li et al. 2011; unbiased for uniform logs)",
    "ips": "inverse propensity scoring",
    "snips": "self-normalised IPS",
    "dm": "direct method (ridge reward model fitted online; no interval: its error is the model's bias)",
    "dr": "doubly robust",
    "cascade": "cascade IPS over each slate's top slots (slates with ids only)",
    "logging": "the logging policy's own mean reward",
}


_INTERVALS = (
    "wilson and score: for rewards at two values only (0/1, or the ends of the reward range), score "
    "intervals that stay informative when few rewards are 1, ips's with the spread of the weights "
    "a success carries as the reward model expects it over every row; model: dr's normal interval "
    "with the variance the reward model gives every row; score-shifted: ips's score interval moved "
    "to dr's value (no success of weight > 0); delta and normal: normal approximations; "
    "bootstrap: percentiles of Poisson bootstrap replicates (--bootstrap; a score interval where "
    "they all agree). Each treats the target's choices at each event as given "
    "(docs/replay_formats.md)."
)


def _num(x: float) -> float | None:
    """JSON has no inf/NaN: None stands for an unbounded or undefined value."""
    return None if x is None or not math.isfinite(x) else float(x)


def _estimate_json(e: Estimate) -> dict[str, Any]:
    return {
        "name": e.name,
        "value": _num(e.value),
        "ci_low": _num(e.ci_low),
        "ci_high": _num(e.ci_high),
        "interval": e.interval,
        "n": int(e.n),
        "ess": _num(e.ess),
        "clipped": int(e.clipped),
    }


def _share_json(v: KeyEstimates) -> dict[str, Any]:
    return {
        "events": v.events,
        "estimates": [_estimate_json(e) for e in v.estimates],
        "logging": _estimate_json(v.logging_value),
    }


def _expected_json(e: ExpectedValue) -> dict[str, Any]:
    return {
        "name": e.name,
        "value": _num(e.value),
        "ci_low": _num(e.ci_low),
        "ci_high": _num(e.ci_high),
        "between_paths_sd": _num(e.between),
        "replicates": e.replicates,
    }


def _target_json(r: ReplayResult, expected: list[ExpectedValue] | None = None) -> dict[str, Any]:
    return {
        "name": r.target,
        "kind": r.kind,
        "estimates": [_estimate_json(e) for e in r.estimates],
        "logging": _estimate_json(r.logging_value),
        "events": r.events,
        "matched": r.matched,
        "match_rate": _num(r.match_rate),
        "off_version": r.off_version,
        "models": {
            k: {"policy": r.policies[k], "n_updates": int(s.get("n_updates", 0))}
            for k, s in sorted(r.models.items())
        },
        "by_key": {k: _share_json(v) for k, v in sorted(r.by_key.items())},
        "keys_without_estimates": r.keys_without_estimates,
        # JSON keys are text: "0" is the top slot.
        "by_position": {str(p): _share_json(v) for p, v in sorted(r.by_position.items())},
        "positions_without_estimates": r.positions_without_estimates,
        "reward_range": {
            "low": r.reward_range[0],
            "high": r.reward_range[1],
            "from": r.reward_range[2],
        },
        # The learner's expected value over learning paths (paths.py); absent without replicates.
        "expected_value": None if expected is None else [_expected_json(e) for e in expected],
        "warnings": list(r.warnings),
    }


def _results(result: ReplayResult | dict[str, ReplayResult]) -> list[ReplayResult]:
    return list(result.values()) if isinstance(result, dict) else [result]


def to_json(
    result: ReplayResult | dict[str, ReplayResult],
    *,
    source: str = "",
    config: str = "",
    clip: float | None = None,
    confidence: float = 0.95,
    expected: dict[str, list[ExpectedValue]] | None = None,
) -> dict[str, Any]:
    """The report as JSON: what was read, then every target (``targets``, in the given order);
    ``expected``: learning target name -> its expected-value intervals (``paths.py``)."""
    results = _results(result)
    first = results[0]
    return {
        "source": source,
        "config": config,
        "clip": clip,
        "confidence": confidence,
        "events": first.events,
        "skipped": first.skipped,
        "skipped_by_reason": dict(first.skipped_by_reason),
        "targets": [_target_json(r, (expected or {}).get(r.target)) for r in results],
        "seconds": round(first.seconds, 3),
        "events_per_s": round(first.events / first.seconds, 1) if first.seconds > 0 else None,
    }


_RANGE_FROM = {
    "given": "--reward-range",
    "seen": "the least and the largest reward of the log; --reward-range sets it",
    "default": "the log has one reward value; --reward-range sets the range",
}


def _fmt(x: float) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return f"{x:.4f}"


def _ess(x: float | None) -> str:
    return f"{x:.1f}" if x is not None and math.isfinite(x) else "n/a"


def _table(estimates: list[Estimate], logging: Estimate, pct: str) -> list[str]:
    lines = [
        f"| estimator | value | {pct} interval | interval kind | n | ESS | clipped | what |",
        "|---|---:|---|---|---:|---:|---:|---|",
    ]
    for e in [*estimates, logging]:
        lines.append(
            f"| {e.name} | {_fmt(e.value)} | {_ci(e)} | {e.interval} | {e.n} | "
            f"{_ess(e.ess)} | {e.clipped} | {_ABOUT.get(e.name, '')} |"
        )
    return lines


def _ci(e: Estimate) -> str:
    return "none" if e.interval == "none" else f"[{_fmt(e.ci_low)}, {_fmt(e.ci_high)}]"


_COMPARED = ("snips", "dr", "ips", "cascade")


def _comparison(
    results: list[ReplayResult], pct: str, expected: dict[str, list[ExpectedValue]] | None
) -> list[str]:
    names = [n for n in _COMPARED if any(e.name == n for r in results for e in r.estimates)]
    shown = [n for n in names if n in ("snips", "dr")] if expected else []
    lines = [
        f"| target | kind | matched | {' | '.join(f'{n} [{pct}]' for n in names)} |"
        + "".join(f" {n} expected value [{pct}] |" for n in shown),
        "|---|---|---:|" + "---|" * (len(names) + len(shown)),
    ]
    for r in results:
        cells = []
        for n in names:
            e = next((x for x in r.estimates if x.name == n), None)
            cells.append("n/a" if e is None else f"{_fmt(e.value)} {_ci(e)}")
        own = {e.name: e for e in (expected or {}).get(r.target, [])}
        for n in shown:
            e = own.get(n)
            cells.append(
                "no learning path" if e is None else f"[{_fmt(e.ci_low)}, {_fmt(e.ci_high)}]"
            )
        lines.append(f"| {r.target} | {r.kind} | {r.matched} | {' | '.join(cells)} |")
    return lines


def _by_key(r: ReplayResult) -> list[str]:
    if len(r.by_key) < 2:
        return []
    keys = sorted(r.by_key, key=lambda k: -r.by_key[k].events)
    lines = [
        "",
        f"Per model key ({len(keys)} keys{f', the {KEYS_SHOWN} with most events' if len(keys) > KEYS_SHOWN else ''}; "
        "replay.json has them all):",
        "",
        "| model key | events | snips | dr | logging |",
        "|---|---:|---|---|---|",
    ]
    for k in keys[:KEYS_SHOWN]:
        v = r.by_key[k]
        est = {e.name: e for e in v.estimates}
        lines.append(
            f"| {k} | {v.events} | {_fmt(est['snips'].value)} {_ci(est['snips'])} | "
            f"{_fmt(est['dr'].value)} {_ci(est['dr'])} | {_fmt(v.logging_value.value)} |"
        )
    return lines


def _by_position(r: ReplayResult) -> list[str]:
    if len(r.by_position) < 2:
        return []
    lines = [
        "",
        "Per position (0 is the top slot; each slot's rows alone, every slot an independent decision):",
        "",
        "| position | events | ips | snips | dr | logging |",
        "|---:|---:|---|---|---|---|",
    ]
    for p, v in sorted(r.by_position.items()):
        est = {e.name: e for e in v.estimates}
        cells = [f"{_fmt(est[n].value)} {_ci(est[n])}" for n in ("ips", "snips", "dr")]
        lines.append(
            f"| {p} | {v.events} | {' | '.join(cells)} | {_fmt(v.logging_value.value)} "
            f"{_ci(v.logging_value)} |"
        )
    return lines


def _expected(r: ReplayResult, expected: list[ExpectedValue], pct: str) -> list[str]:
    path = {e.name: e for e in r.estimates}
    reps = max((e.replicates for e in expected), default=0)
    lines = [
        "",
        f"Expected value over learning paths ({reps} replicate replays of the learner over "
        "bootstrap resamples of the log): the value a deployment of this configuration can "
        "expect, where the path interval covers this log's one learning path; the path "
        "interval widened by the spread between paths (docs/replay_formats.md).",
        "",
        f"| estimator | value | path {pct} interval | expected-value {pct} interval | "
        "sd between paths |",
        "|---|---:|---|---|---:|",
    ]
    for e in expected:
        lines.append(
            f"| {e.name} | {_fmt(e.value)} | {_ci(path[e.name])} | "
            f"[{_fmt(e.ci_low)}, {_fmt(e.ci_high)}] | {_fmt(e.between)} |"
        )
    return lines


def to_markdown(
    result: ReplayResult | dict[str, ReplayResult],
    *,
    source: str = "",
    confidence: float = 0.95,
    expected: dict[str, list[ExpectedValue]] | None = None,
) -> str:
    results = _results(result)
    first = results[0]
    pct = f"{confidence * 100:g}%"
    lines = []
    if source:
        lines += [
            f"Replay of `{source}`: {first.events} events"
            f"{f', {first.skipped} rows skipped' if first.skipped else ''}"
            f"{f', {len(results)} targets' if len(results) > 1 else ''}.",
            "",
        ]
    if len(results) > 1:
        lines += _comparison(results, pct, expected) + [""]
    for r in results:
        if len(results) > 1 or r.target != "target":
            lines += [f"### {r.target} ({r.kind})", ""]
        lines.append(
            f"{r.matched} of {r.events} events matched ({100 * r.match_rate:.1f}%)"
            f"{f', {r.off_version} decisions off their logged version' if r.off_version else ''}."
        )
        lo, hi, whence = r.reward_range
        lines += [
            "",
            f"Rewards in [{lo:g}, {hi:g}] ({_RANGE_FROM[whence]}): every value and bound is "
            "kept inside it.",
        ]
        lines += [""] + _table(r.estimates, r.logging_value, pct)
        if expected and expected.get(r.target):
            lines += _expected(r, expected[r.target], pct)
        lines += _by_key(r) + _by_position(r)
        if r.warnings:
            lines += ["", "Warnings:", *(f"- {w}" for w in r.warnings)]
        lines.append("")
    kinds = sorted({r.kind for r in results}, key=list(KINDS).index)
    lines += ["Kinds: " + "; ".join(f"{k}: {KINDS[k]}" for k in kinds) + ".", ""]
    lines += ["Intervals: " + _INTERVALS]
    return "\n".join(lines) + "\n"


def plot(result: ReplayResult, path: str | Path, *, title: str = "") -> bool:
    """The running estimates against events replayed, each with its final interval drawn at the
    right edge, and the logging policy's value as a dashed line. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(10, 5), sharey=True, gridspec_kw={"width_ratios": [3, 1]}
    )
    colors: dict[str, str] = {}
    for name, pts in result.running.items():
        if pts:
            xs, ys = zip(*pts)
            (line,) = ax.plot(xs, ys, label=name, lw=1.2)
            colors[name] = line.get_color()
    lv = result.logging_value
    for a in (ax, bx):
        if math.isfinite(lv.value):
            a.axhline(
                lv.value, color="k", ls="--", lw=1, label="logging policy" if a is ax else None
            )
    ax.set_xscale("log")
    ax.set_xlabel("events replayed")
    ax.set_ylabel("estimated value (mean reward)")
    ax.set_title(title or f"replay: {result.events} events, {result.matched} matched")
    ax.legend(loc="best", fontsize=8)
    # The final estimates with their intervals (unbounded ones drawn as a bare point).
    for i, e in enumerate(result.estimates):
        if not math.isfinite(e.value):
            continue
        bounded = math.isfinite(e.ci_low) and math.isfinite(e.ci_high)
        yerr = [[e.value - e.ci_low], [e.ci_high - e.value]] if bounded else None
        bx.errorbar([i], [e.value], yerr=yerr, fmt="o", capsize=4, color=colors.get(e.name))
    bx.set_xticks(range(len(result.estimates)), [e.name for e in result.estimates])
    bx.set_xlim(-0.6, len(result.estimates) - 0.4)
    bx.set_title("final, with intervals")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_report(
    result: ReplayResult | dict[str, ReplayResult],
    out_dir: str | Path,
    *,
    source: str = "",
    config: str = "",
    clip: float | None = None,
    confidence: float = 0.95,
    expected: dict[str, list[ExpectedValue]] | None = None,
    figures: FigureProcess | None = None,
) -> list[Path]:
    """Write ``replay.md``, ``replay.json`` and (with matplotlib) ``replay.png`` of the first
    target's running estimates and, with several targets, ``targets.png``; the paths written.
    ``figures``: the child process that draws the figures (started before the replay), if any."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js, png = out / "replay.md", out / "replay.json", out / "replay.png"
    # What the figures read, without the per-event decisions and the models' states (a large
    # log's decisions would be pickled to the figure process for nothing).
    results = [dataclasses.replace(r, decisions={}, models={}) for r in _results(result)]
    calls: list = [
        (plot, (results[0], png), {"title": f"replay of {Path(source).name}" if source else ""})
    ]
    paths = [png]
    if len(results) > 1:
        calls.append((plot_targets, (results, out / "targets.png"), {}))
        paths.append(out / "targets.png")
    # Handed over first: the figure process draws while this one writes the other files (a
    # large log's replay.json, with every decision, takes as long as the figures).
    if figures is not None:
        figures.send(calls)
    md.write_text(to_markdown(result, source=source, confidence=confidence, expected=expected))
    js.write_text(
        json.dumps(
            to_json(
                result,
                source=source,
                config=config,
                clip=clip,
                confidence=confidence,
                expected=expected,
            ),
            indent=2,
        )
        + "\n"
    )
    written = [md, js]
    drawn = figures.results() if figures is not None else [f(*a, **k) for f, a, k in calls]
    written += [path for path, ok in zip(paths, drawn) if ok]
    return written


def plot_targets(results: list[ReplayResult], path: str | Path) -> bool:
    """Each target's snips and dr with their intervals, side by side, and the logging policy's
    value as a dashed line. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(results) + 2), 4.5))
    for j, name in enumerate(("snips", "dr")):
        for i, r in enumerate(results):
            e = r.estimate(name)
            if not math.isfinite(e.value):
                continue
            bounded = math.isfinite(e.ci_low) and math.isfinite(e.ci_high)
            yerr = [[e.value - e.ci_low], [e.ci_high - e.value]] if bounded else None
            ax.errorbar(
                [i + (j - 0.5) * 0.25],
                [e.value],
                yerr=yerr,
                fmt="os"[j],
                capsize=4,
                color=f"C{j}",
                label=name if i == 0 else None,
            )
    lv = results[0].logging_value
    if math.isfinite(lv.value):
        ax.axhline(lv.value, color="k", ls="--", lw=1, label="logging policy")
    ax.set_xticks(range(len(results)), [f"{r.target}\n({r.kind})" for r in results])
    ax.set_ylabel("estimated value (mean reward)")
    ax.set_title("targets on one log")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
