"""The functional core never imports the Kafka client: policies, numerics, the codec, the
decision/join engine, the merge and the simulator import with confluent_kafka blocked. Only the
runtime shell (worker, broker, logs, snapshots, demo) may import it."""

import subprocess
import sys

PURE = [
    "streambandit", "streambandit.errors", "streambandit.reasons", "streambandit.linalg", "streambandit.events",
    "streambandit.policies.base", "streambandit.policies.oful", "streambandit.policies.glb_omd",
    "streambandit.policies.hvt_ucb", "streambandit.policies.soful", "streambandit.policies.cbscfd",
    "streambandit.policies.dbs_linucb", "streambandit.sketch.frequent_directions", "streambandit.sketch.woodbury",
    "streambandit.sketch.dyadic_block", "streambandit.policies.bkb", "streambandit.sketch.nystrom",
    "streambandit.replay.logged", "streambandit.replay.estimators", "streambandit.replay.files",
    "streambandit.replay.runner", "streambandit.replay.report", "streambandit.sim.ads", "streambandit.sim.baselines", "streambandit.sim.gp_ucb",
    "streambandit.sim.experiments.base", "streambandit.sim.experiments.glb_omd_logistic",
    "streambandit.sim.experiments.hvt_ucb", "streambandit.sim.experiments.bkb", "streambandit.progress", "streambandit.sim.environments",
    "streambandit.sim.runner", "streambandit.stream.engine", "streambandit.stream.merge",
    "streambandit.stream.decision", "streambandit.stream.models_config", "streambandit.stream.kafka_config",
]

BLOCK = """
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "confluent_kafka" or name.startswith("confluent_kafka."):
            raise ImportError(f"{name} is blocked: the pure core must not import it")
sys.meta_path.insert(0, Block())
for m in sys.argv[1:]:
    importlib.import_module(m)
"""


def test_the_pure_core_imports_without_the_kafka_client():
    out = subprocess.run([sys.executable, "-c", BLOCK, *PURE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_blocker_really_blocks():
    out = subprocess.run([sys.executable, "-c", BLOCK, "streambandit.stream.worker"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "confluent_kafka is blocked" in out.stderr
