"""Streaming BKB (``bkb_stream``) on a stream of new arm vectors: time per update and per decision,
and state bytes, as t grows; exact ``bkb`` in the same run for contrast.

    python -m bench.bkb_stream            # t to 100,000 at d = 10 and 50 (~10 min), writes results
    python -m bench.bkb_stream --quick    # t to 2,000, prints only

Every round brings K = 20 new unit vectors (the contextual setting: no arm is seen twice), the
learner chooses one (``select``, timed as the decision) and learns its reward (``update``, timed),
reward ``x . theta + N(0, 0.1^2)``. ``bkb_stream`` at its defaults (m_max = 256, qbar = 4,
resparsify_at = 1, min_gap = 64). Each checkpoint t reports the median over the 500 rounds
ending at t (a resparsification falls in about one update in 64 once the dictionary is full: the
mean shows its amortised cost). Exact ``bkb`` (Fig. 1, every distinct point kept) runs the same
stream at d = 10 to t = 100 only: its update time grows with t.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench import harness
from streambandit import make_policy

K = 20
DIMS = (10, 50)
CHECKPOINTS = (1_000, 10_000, 100_000)
QUICK_CHECKPOINTS = (500, 2_000)
WINDOW = 500
EXACT_CHECKPOINTS = (25, 50, 100)
TARGET_UPDATE_MS = 1.0


def _stream(policy, d: int, checkpoints: tuple[int, ...], window: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(d)
    theta /= np.linalg.norm(theta)
    upd, sel = [], []
    out = []
    for t in range(1, checkpoints[-1] + 1):
        arms = rng.standard_normal((K, d))
        arms /= np.linalg.norm(arms, axis=1, keepdims=True)
        t0 = time.perf_counter()
        i = policy.select(arms)
        t1 = time.perf_counter()
        policy.update(arms[i], float(arms[i] @ theta + 0.1 * rng.standard_normal()))
        t2 = time.perf_counter()
        sel.append(t1 - t0)
        upd.append(t2 - t1)
        if t in checkpoints:
            w = min(window, t)
            out.append(
                {
                    "t": t,
                    "update_ms_median": 1e3 * float(np.median(upd[-w:])),
                    "update_ms_mean": 1e3 * float(np.mean(upd[-w:])),
                    "decision_ms_median": 1e3 * float(np.median(sel[-w:])),
                    "state_bytes": policy.state_nbytes(),
                    "points": policy.n_points,
                    "resparsifications": getattr(policy, "resparsifications", 0),
                }
            )
            print(
                f"{policy.name} d={d} t={t}: "
                + ", ".join(f"{k} {v:.3g}" for k, v in out[-1].items() if k != "t"),
                flush=True,
            )
        if len(upd) > window:
            del upd[:-window], sel[:-window]
    return out


def measure(args: argparse.Namespace) -> dict:
    checkpoints = QUICK_CHECKPOINTS if args.quick else CHECKPOINTS
    res: dict = {"K": K, "window": WINDOW, "m_max": 256, "stream": {}, "exact": {}}
    for d in DIMS:
        res["stream"][str(d)] = _stream(make_policy("bkb_stream", dim=d), d, checkpoints, WINDOW)
    res["exact"]["10"] = _stream(make_policy("bkb", dim=10), 10, EXACT_CHECKPOINTS, 25)
    return res


def render(res: dict) -> str:
    m_max = res["m_max"]
    bound = {d: 8 * (m_max * int(d) + 3 * m_max**2 + 2 * m_max + 5) for d in res["stream"]}
    lines = [
        "# Streaming BKB on new arm vectors every round",
        "",
        harness.provenance(res, "BLAS pinned to one thread."),
        "",
        f"K = {res['K']} new unit vectors per round, reward x . theta + N(0, 0.1^2); `bkb_stream` at its defaults "
        f"(m_max = {m_max}). Times are the median (and mean) over the {res['window']} rounds ending at t. "
        f"State bound: 8 (m d + 3 m^2 + 2 m + 5) bytes at m = m_max.",
        "",
        "| learner | d | t | update ms (median) | update ms (mean) | decision ms (median) | dictionary | "
        "resparsifications | state bytes | state bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d, rows in res["stream"].items():
        for r in rows:
            lines.append(
                f"| bkb_stream | {d} | {r['t']:,} | {r['update_ms_median']:.3f} | {r['update_ms_mean']:.3f} | "
                f"{r['decision_ms_median']:.3f} | {r['points']} | {r['resparsifications']} | "
                f"{r['state_bytes']:,} | {bound[d]:,} |"
            )
    for d, rows in res["exact"].items():
        for r in rows:
            lines.append(
                f"| bkb (exact) | {d} | {r['t']:,} | {r['update_ms_median']:.3f} | {r['update_ms_mean']:.3f} | "
                f"{r['decision_ms_median']:.3f} | {r['points']} | - | {r['state_bytes']:,} | - |"
            )
    verdicts = []
    for d, rows in res["stream"].items():
        first, last = rows[0], rows[-1]
        worst = max(r["update_ms_mean"] for r in rows)
        within = all(r["state_bytes"] <= bound[d] for r in rows)
        verdicts.append(
            f"d = {d}: the mean update takes {worst:.3f} ms at worst "
            f"({'under' if worst < TARGET_UPDATE_MS else 'over'} "
            f"the {TARGET_UPDATE_MS:g} ms target), the median "
            f"{last['update_ms_median'] / first['update_ms_median']:.2f}x "
            f"and the decision {last['decision_ms_median'] / first['decision_ms_median']:.2f}x "
            f"from t = {first['t']:,} to "
            f"{last['t']:,}; the state stays within its bound ({'yes' if within else 'NO'})"
        )
    exact = next(iter(res["exact"].values()))
    lines += [
        "",
        "; ".join(verdicts) + ".",
        f"Exact bkb on the same stream: {exact[0]['update_ms_median']:.1f} ms per update at t = {exact[0]['t']} and "
        f"{exact[-1]['update_ms_median']:.1f} ms at t = {exact[-1]['t']}, holding every pulled point.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("bkb_stream", __doc__, measure, render))
