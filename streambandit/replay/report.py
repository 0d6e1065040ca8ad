"""The report of a replay: a Markdown table, a JSON document and (with matplotlib) a PNG of the
running estimates with their final intervals and the logging policy's value."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from streambandit.replay.estimators import Estimate
from streambandit.replay.runner import ReplayResult

__all__ = ["to_json", "to_markdown", "plot", "write_report"]

_ABOUT = {
    "replay": "mean reward where the target chose the logged arm (Li et al. 2011; unbiased for uniform logs)",
    "ips": "inverse propensity scoring",
    "snips": "self-normalised IPS",
    "dm": "direct method (ridge reward model fitted online; no interval: its error is the model's bias)",
    "dr": "doubly robust",
    "logging": "the logging policy's own mean reward",
}


_INTERVALS = ("wilson and score: for rewards at two values only (0/1, or the ends of --reward-range), score "
              "intervals that stay informative when few rewards are 1; delta and normal: normal approximations; "
              "bootstrap: percentiles of Poisson bootstrap replicates (--bootstrap). Each treats the target's "
              "choices at each event as given (docs/replay_formats.md).")


def _num(x: float) -> float | None:
    """JSON has no inf/NaN: None stands for an unbounded or undefined value."""
    return None if x is None or not math.isfinite(x) else float(x)


def _estimate_json(e: Estimate) -> dict[str, Any]:
    return {"name": e.name, "value": _num(e.value), "ci_low": _num(e.ci_low), "ci_high": _num(e.ci_high),
            "interval": e.interval, "n": int(e.n), "ess": _num(e.ess), "clipped": int(e.clipped)}


def to_json(result: ReplayResult, *, source: str = "", config: str = "", clip: float | None = None,
            confidence: float = 0.95) -> dict[str, Any]:
    return {
        "source": source,
        "config": config,
        "clip": clip,
        "confidence": confidence,
        "estimates": [_estimate_json(e) for e in result.estimates],
        "logging": _estimate_json(result.logging_value),
        "events": result.events,
        "matched": result.matched,
        "match_rate": _num(result.match_rate),
        "skipped": result.skipped,
        "skipped_by_reason": dict(result.skipped_by_reason),
        "off_version": result.off_version,
        "models": {k: {"policy": result.policies[k], "n_updates": int(s.get("n_updates", 0))}
                   for k, s in sorted(result.models.items())},
        "warnings": list(result.warnings),
        "seconds": round(result.seconds, 3),
        "events_per_s": round(result.events / result.seconds, 1) if result.seconds > 0 else None,
    }


def _fmt(x: float) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return f"{x:.4f}"


def _ess(x: float | None) -> str:
    return f"{x:.1f}" if x is not None and math.isfinite(x) else "n/a"


def to_markdown(result: ReplayResult, *, source: str = "", confidence: float = 0.95) -> str:
    pct = f"{confidence * 100:g}%"
    lines = []
    if source:
        lines += [f"Replay of `{source}`: {result.events} events, {result.matched} matched "
                  f"({100 * result.match_rate:.1f}%)"
                  f"{f', {result.skipped} rows skipped' if result.skipped else ''}"
                  f"{f', {result.off_version} decisions off their logged version' if result.off_version else ''}.",
                  ""]
    lines += [f"| estimator | value | {pct} interval | interval kind | n | ESS | clipped | what |",
              "|---|---:|---|---|---:|---:|---:|---|"]
    for e in [*result.estimates, result.logging_value]:
        ci = "none" if e.interval == "none" else f"[{_fmt(e.ci_low)}, {_fmt(e.ci_high)}]"
        lines.append(f"| {e.name} | {_fmt(e.value)} | {ci} | {e.interval} | {e.n} | "
                     f"{_ess(e.ess)} | {e.clipped} | {_ABOUT.get(e.name, '')} |")
    lines += ["", "Intervals: " + _INTERVALS]
    if result.warnings:
        lines += ["", "Warnings:", *(f"- {w}" for w in result.warnings)]
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
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 5), sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    colors: dict[str, str] = {}
    for name, pts in result.running.items():
        if pts:
            xs, ys = zip(*pts)
            (line,) = ax.plot(xs, ys, label=name, lw=1.2)
            colors[name] = line.get_color()
    lv = result.logging_value
    for a in (ax, bx):
        if math.isfinite(lv.value):
            a.axhline(lv.value, color="k", ls="--", lw=1, label="logging policy" if a is ax else None)
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


def write_report(result: ReplayResult, out_dir: str | Path, *, source: str = "", config: str = "",
                 clip: float | None = None, confidence: float = 0.95) -> list[Path]:
    """Write ``replay.md``, ``replay.json`` and (with matplotlib) ``replay.png``; the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js, png = out / "replay.md", out / "replay.json", out / "replay.png"
    md.write_text(to_markdown(result, source=source, confidence=confidence))
    js.write_text(json.dumps(to_json(result, source=source, config=config, clip=clip, confidence=confidence),
                             indent=2) + "\n")
    written = [md, js]
    if plot(result, png, title=f"replay of {Path(source).name}" if source else ""):
        written.append(png)
    return written
