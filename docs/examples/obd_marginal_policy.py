"""An external target for `streambandit replay --external`: the Open Bandit Dataset's Bernoulli
Thompson Sampling policy as its log shows it, the share of each item at each position in the BTS
campaign's log (its marginal policy over the log's period), written for every row of another log.

    python docs/examples/obd_marginal_policy.py BTS_DIR RANDOM_DIR OUT.csv

BTS_DIR and RANDOM_DIR are OBD campaign directories (e.g. obd/bts/all and obd/random/all, from
obp's source distribution). Prints the BTS log's own click rate, the value the estimates of
this target are compared with. Standard library only.
"""

import csv
import sys
from collections import Counter
from pathlib import Path


def rows(campaign: Path):
    with open(campaign / f"{campaign.name}.csv", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        at = {name: i for i, name in enumerate(header)}
        for row in reader:
            yield row[0], int(row[at["item_id"]]), int(row[at["position"]]), int(row[at["click"]])


def main(bts: Path, random: Path, out: Path) -> None:
    with open(random / "item_context.csv", newline="") as f:
        items = sorted(int(r["item_id"]) for r in csv.DictReader(f))  # the reader's arm order
    shown: dict[int, Counter] = {}
    clicks = n = 0
    for _, item, position, click in rows(bts):
        shown.setdefault(position, Counter())[item] += 1
        clicks, n = clicks + click, n + 1
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["event_id", "probs"])
        for index, _, position, _ in rows(random):
            counts = shown[position]
            total = sum(counts[i] for i in items)
            w.writerow([index, "|".join(repr(counts[i] / total) for i in items)])
    print(f"BTS log: {n} rows, click rate {clicks / n:.4f}")


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))
