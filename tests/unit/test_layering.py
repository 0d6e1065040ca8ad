"""The functional core never imports the Kafka client: policies, numerics, the codec, the
decision/join engine, the merge and the simulator import with confluent_kafka blocked. Only the
runtime shell (worker, broker, logs, snapshots, demo) may import it."""

import ast
import subprocess
import sys
from pathlib import Path

PURE = [
    "streambandit", "streambandit.errors", "streambandit.reasons", "streambandit.linalg", "streambandit.wire",
    "streambandit.policies.base", "streambandit.policies.oful", "streambandit.policies.glb_omd",
    "streambandit.policies.hvt_ucb", "streambandit.policies.soful", "streambandit.policies.cbscfd",
    "streambandit.policies.dbs_linucb", "streambandit.sketch.frequent_directions", "streambandit.sketch.woodbury",
    "streambandit.sketch.dyadic_block", "streambandit.policies.bkb", "streambandit.sketch.nystrom",
    "streambandit.policies.bkb_stream", "streambandit.sketch.online_nystrom", "streambandit.replay.sums",
    "streambandit.atomic", "streambandit.decider",
    "streambandit.replay.logged", "streambandit.replay.estimators", "streambandit.replay.files",
    "streambandit.replay.runner", "streambandit.replay.report", "streambandit.replay.featurize",
    "streambandit.replay.obd", "streambandit.replay.dsjson", "streambandit.replay.states", "streambandit.replay.tune",
    "streambandit.sim.ads", "streambandit.sim.baselines",
    "streambandit.sim.gp_ucb",
    "streambandit.sim.experiments.base", "streambandit.sim.experiments.glb_omd_logistic",
    "streambandit.sim.experiments.hvt_ucb", "streambandit.sim.experiments.bkb", "streambandit.progress",
    "streambandit.sim.environments",
    "streambandit.sim.runner", "streambandit.stream.engine", "streambandit.stream.merge",
    "streambandit.decision", "streambandit.models_config", "streambandit.stream.kafka_config",
    "streambandit.wire.codec", "streambandit.wire.snapshot", "streambandit.wire.batch_decode",
    "streambandit.wire.batch_encode", "streambandit.rowwise", "streambandit.kernels", "streambandit.event_draw",
    "streambandit.warmup",
    "streambandit.stream.stall", "streambandit.stream.batch", "streambandit.stream.worker_config",
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


# -- the direction of imports between the packages ----------------------------------------------
# Read from the source (every import statement, function-level ones included), so that a new
# import in either direction fails here even if no test imports the module.


ROOT = Path(__file__).resolve().parents[2] / "streambandit"
# The learners, their numerics, the decision rule, the model configuration and the record codec:
# below everything else, importing none of the packages that use them.
CORE = ("streambandit.policies", "streambandit.sketch", "streambandit.linalg", "streambandit.rowwise",
        "streambandit.kernels", "streambandit.decision", "streambandit.models_config", "streambandit.wire",
        "streambandit.errors", "streambandit.reasons")
ABOVE_CORE = ("streambandit.stream", "streambandit.replay", "streambandit.sim", "streambandit.export",
              "streambandit.cli", "streambandit.benchmarks", "streambandit.warmup")
# Who may not import whom. stream/ (the runtime) and replay/ (offline evaluation) are siblings;
# export.py is the one module that reads the runtime's topics into replay's input.
FORBIDDEN = {
    "streambandit.replay": ("streambandit.stream", "streambandit.export", "streambandit.cli"),
    "streambandit.stream": ("streambandit.replay", "streambandit.export", "streambandit.cli"),
    **{core: ABOVE_CORE for core in CORE},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every streambandit module the source of ``module`` imports, as dotted names (``from a
    import b`` counts as both ``a`` and ``a.b``, since b may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up level - 1 packages from this module's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m == "streambandit" or m.startswith("streambandit.")}


def violations(modules: dict[str, set[str]]) -> list[str]:
    found = []
    for name, imports in sorted(modules.items()):
        for owner, banned in FORBIDDEN.items():
            if name == owner or name.startswith(owner + "."):
                found += [f"{name} imports {m}" for m in sorted(imports)
                          if any(m == b or m.startswith(b + ".") for b in banned)]
    return found


def test_imports_go_one_way_between_the_packages():
    modules = {module_name(p): imported_modules(p.read_text(), module_name(p), p.name == "__init__.py")
               for p in ROOT.rglob("*.py")}
    assert "streambandit.replay.runner" in modules and "streambandit.stream.worker" in modules
    assert violations(modules) == []


def test_the_direction_check_sees_both_directions():
    """A replay module importing the runtime, and the runtime importing replay, are both caught,
    also through a relative or function-level import."""
    bad = {
        "streambandit.replay.runner": imported_modules("def f():\n    from ..stream import engine\n",
                                                       "streambandit.replay.runner"),
        "streambandit.stream.worker": imported_modules("import streambandit.replay.logged\n",
                                                       "streambandit.stream.worker"),
        "streambandit.policies.oful": imported_modules("from streambandit.sim.ads import AdTraffic\n",
                                                       "streambandit.policies.oful"),
    }
    assert violations(bad) == [
        "streambandit.policies.oful imports streambandit.sim.ads",
        "streambandit.policies.oful imports streambandit.sim.ads.AdTraffic",
        "streambandit.replay.runner imports streambandit.stream",
        "streambandit.replay.runner imports streambandit.stream.engine",
        "streambandit.stream.worker imports streambandit.replay.logged",
    ]
