"""The engine's outputs and snapshot, byte for byte, as the code before its compiled speed-ups
made them: the learners' kernels now interleave their sums and the per-call path fuses its checks,
and neither may change a bit of what a worker publishes or stores.

``GOLDEN`` is :func:`run`'s digest at commit 1556af9, the code before those changes (the same
function run there). The stream is made as the crash-recovery test's (tests/integration/
test_crash_recovery.py) makes its own: contexts of 40 models, 0-2 rewards each, early, late and duplicate ones,
windows closing, exploration draws, and the three aggregations. The learners are oful models only:
their path is compiled loops summed in index order, the same bits on any x86 CPU. glb_omd's and
hvt_ucb's projections call LAPACK (``np.linalg.eigh``), whose bits can differ between CPUs, so a
digest of them would not hold on every machine.
"""

import hashlib
import tomllib

import numpy as np

from streambandit.config.models import parse_models_config
from streambandit.engine.partition import PartitionEngine, Rejected
from streambandit.wire import Context, Reward, encode
from streambandit.wire.snapshot import pack_snapshot

GOLDEN = "dc6a89711a59bf78778bb0c4ae6ab9849e9a5532edde3c4591a5cd6c259280bc"

MODELS = """
[[models]]
match = "sum-*"
policy = "oful"
dim = 4
reward_window_ms = 400
default_reward = 0.0
aggregation = "sum"
epsilon = 0.1
[models.hyper]
beta_scale = 1.0

[[models]]
match = "first-*"
policy = "oful"
dim = 4
reward_window_ms = 300
default_reward = 0.5
aggregation = "first"
[models.hyper]
beta_scale = 0.3
lam = 2.0

[[models]]
match = "oful-*"
policy = "oful"
dim = 4
reward_window_ms = 350
default_reward = 0.0
aggregation = "last"
epsilon = 0.05
[models.hyper]
beta = 0.4
beta_scale = 1.0

[[models]]
match = "lin-*"
policy = "oful"
dim = 4
reward_window_ms = 250
default_reward = 0.0
aggregation = "first"
[models.hyper]
beta_scale = 1.0
noise_sd = 0.2
"""


def run(n=1500, seed=0) -> tuple[str, int]:
    """The digest of every output (encoded) and of the final snapshot, and the outputs' count."""
    e = PartitionEngine(parse_models_config(tomllib.loads(MODELS)))
    rng = np.random.default_rng(seed)
    events = []
    for i in range(n):
        key = f"{('sum', 'first', 'oful', 'lin')[i % 4]}-{i % 40}"
        ts = 10_000 + 10 * i
        arms = rng.standard_normal((3, 4)) / 3
        events.append((ts, 0, Context(f"e{i}", key, ts, ("x", "y", "z"), arms)))
        for _ in range(int(rng.integers(0, 3))):
            d = int(rng.integers(-20, 600))
            events.append((ts + d, 1, Reward(f"e{i}", key, ts + d, float(rng.integers(0, 3)) / 2)))
    h = hashlib.sha256()
    outs = []
    for _, src, ev in sorted(events, key=lambda x: (x[0], x[1])):
        outs += (e.on_context if src == 0 else e.on_reward)(ev)
    outs += e.advance_to(10**12)
    for o in outs:
        h.update(f"{o.reason}|{o.detail}".encode() if isinstance(o, Rejected) else encode(o))
    header = {
        "partition": 0,
        "created_ms": 0,
        "contexts_offset": 0,
        "rewards_offset": 0,
        "actions_offset": 0,
        "joined_offset": 0,
        "dead_letter_offset": 0,
    }
    h.update(pack_snapshot({**header, "engine": e.snapshot()}))
    return h.hexdigest(), len(outs)


def test_outputs_and_snapshot_are_the_bytes_the_code_before_made():
    digest, n = run()
    assert n == 3732
    assert digest == GOLDEN
