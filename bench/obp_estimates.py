"""obp's side of ``bench.obd_vs_obp``: obp's IPS, SNIPS and DR of given targets on given OBD rows.

    OBP_PYTHON bench/obp_estimates.py OBD_DIR ROWS.npz OUT.json

Run by the Python of an environment that has obp (0.5.7), not streambandit's: it imports only
numpy, scikit-learn and obp. ``OBD_DIR`` holds ``random/all``; ``ROWS.npz`` (written by
``bench.obd_vs_obp``) names the rows to evaluate by their index in ``all.csv`` (``ids``) and
gives, for each row, every target's probabilities over the items at the row's position
(``probs_<target>``, shape (n, K)) and streambandit's reward-model predictions (``predicted``).

obp reads the campaign itself (``OpenBanditDataset``, its own sort and position encoding); its
rows are matched to ours by index, so obp sees the same rows, actions, positions, clicks and
propensities. Per target: ``InverseProbabilityWeighting``, ``SelfNormalizedInverseProbabilityWeighting``
and ``DoublyRobust`` twice, with obp's ``RegressionModel`` (logistic regression, 3-fold cross
fitting, obp's default context features) and with streambandit's predictions; each with obp's
bootstrap interval (``estimate_interval``, 95%).
"""

import json
import sys
from pathlib import Path

import numpy as np
from obp.dataset import OpenBanditDataset
from obp.ope import (
    DoublyRobust,
    InverseProbabilityWeighting,
    RegressionModel,
    SelfNormalizedInverseProbabilityWeighting,
)
from obp.version import __version__
from sklearn.linear_model import LogisticRegression

SEED = 12345
BOOTSTRAP = 1000


def main(obd: Path, rows: Path, out: Path) -> None:
    given = np.load(rows)
    ds = OpenBanditDataset(behavior_policy="random", campaign="all", data_path=obd)
    fb = ds.obtain_batch_bandit_feedback()
    at = {int(i): j for j, i in enumerate(ds.data.index)}
    pick = np.array([at[int(i)] for i in given["ids"]])
    action, position = fb["action"][pick], fb["position"][pick]
    reward, pscore, context = fb["reward"][pick], fb["pscore"][pick], fb["context"][pick]
    n, k, slots = len(pick), fb["n_actions"], int(fb["position"].max()) + 1

    def by_slot(x):
        """(n, K) at each row's position -> obp's (n, K, len_list); obp reads the row's slot."""
        return np.repeat(np.asarray(x, dtype=float)[:, :, None], slots, axis=2)

    regression = RegressionModel(
        n_actions=k,
        len_list=slots,
        action_context=fb["action_context"],
        base_model=LogisticRegression(max_iter=1000, C=100, random_state=SEED),
    )
    theirs = regression.fit_predict(
        context=context,
        action=action,
        reward=reward,
        position=position,
        pscore=pscore,
        n_folds=3,
        random_state=SEED,
    )
    ours = by_slot(given["predicted"])
    data = dict(reward=reward, action=action, position=position, pscore=pscore)
    result = {"obp": __version__, "rows": n, "clicks": int(reward.sum()), "targets": {}}
    for key in given.files:
        if not key.startswith("probs_"):
            continue
        dist = by_slot(given[key])
        estimators = {
            "ips": (InverseProbabilityWeighting(), {}),
            "snips": (SelfNormalizedInverseProbabilityWeighting(), {}),
            "dr": (DoublyRobust(), {"estimated_rewards_by_reg_model": theirs}),
            "dr_our_rewards": (DoublyRobust(), {"estimated_rewards_by_reg_model": ours}),
        }
        got = {}
        for name, (est, extra) in estimators.items():
            value = est.estimate_policy_value(action_dist=dist, **data, **extra)
            ci = est.estimate_interval(
                action_dist=dist,
                **data,
                **extra,
                alpha=0.05,
                n_bootstrap_samples=BOOTSTRAP,
                random_state=SEED,
            )
            low, high = ci["95.0% CI (lower)"], ci["95.0% CI (upper)"]
            got[name] = {"value": float(value), "ci_low": float(low), "ci_high": float(high)}
        result["targets"][key[len("probs_") :]] = got
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
