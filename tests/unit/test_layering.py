"""The package's folders are layers, and imports only run down them.

Every module belongs to exactly one layer (a folder, or a named module of the package root); a
module may import its own layer and the layers below it, never one above, and never a sibling
layer of the same floor. Only the Kafka-facing layers may import the Kafka client. The imports are
read from the source (every import statement, function-level ones included), so a new import
fails here even if no test imports the module; the pure layers are also imported with
confluent_kafka blocked, so a dependency that only some code path reaches is caught too.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "streambandit"

# Floors, lowest first. A layer may import the layers of lower floors and itself; layers that
# share a floor are siblings and import none of each other.
FLOORS: list[dict[str, tuple[str, ...]]] = [
    # Errors, reason codes, atomic files, log line formats, credentials' masking, the progress
    # line: no imports of ours.
    {
        "base": (
            "streambandit.errors",
            "streambandit.reasons",
            "streambandit.atomic",
            "streambandit.progress",
            "streambandit.log_format",
            "streambandit.redaction",
        )
    },
    {"numerics": ("streambandit.numerics",)},  # compiled kernels, row-wise products, linalg
    {"sketch": ("streambandit.sketch",)},  # Frequent Directions, dyadic blocks, Nystrom
    {"policies": ("streambandit.policies",)},  # the learners
    {"wire": ("streambandit.wire",)},  # records, Avro, the snapshot format
    {"config": ("streambandit.config",)},  # the typed configuration, no Kafka client
    {"engine": ("streambandit.engine",)},  # decide, join, windows, merge, chains: pure
    # Three drivers of the engine and the learners, siblings: the Kafka runtime, offline
    # evaluation and the simulator.
    {
        "stream": ("streambandit.stream",),
        "replay": ("streambandit.replay",),
        "sim": ("streambandit.sim",),
    },
    {"serving": ("streambandit.serving",)},  # Decider, api, replicas
    {"dev": ("streambandit.dev",)},  # embedded broker, demo, simulated ad server
    # The one bridge from the runtime's topics to replay's input, and the in-process benchmark.
    {"export": ("streambandit.export",), "benchmarks": ("streambandit.benchmarks",)},
    {"cli": ("streambandit.cli", "streambandit.__main__")},  # the commands
]
# Layers that talk to Kafka; every other layer must import without the client.
KAFKA_LAYERS = {"stream", "serving", "dev", "export", "cli"}
# The package's face (``from streambandit import make_policy``) hands on the learners and, lazily,
# the Decider: importing it is allowed from every layer.
FACE = "streambandit"


def layer_of(module: str) -> str | None:
    for floor in FLOORS:
        for layer, prefixes in floor.items():
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                return layer
    return None


FLOOR_OF = {layer: i for i, floor in enumerate(FLOORS) for layer in floor}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module the source of ``module`` imports, as dotted names (``from a import b`` counts
    as both ``a`` and ``a.b``, since b may be a module)."""
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
    return out


def violations(modules: dict[str, set[str]]) -> list[str]:
    """Each import that runs up or sideways between layers, or reaches the Kafka client from a
    pure layer."""
    found = []
    for name, imports in sorted(modules.items()):
        own = layer_of(name)
        if own is None:  # the face: its lazy export of the Decider is the one arrow allowed up
            continue
        if own not in KAFKA_LAYERS and any(m.split(".")[0] == "confluent_kafka" for m in imports):
            found.append(f"{name} ({own}) imports the Kafka client")
        for m in sorted(imports):
            if not m.startswith(FACE + "."):  # another library, or the face
                continue
            other = layer_of(m)
            if other is None or other == own:
                continue
            if FLOOR_OF[other] > FLOOR_OF[own]:
                found.append(f"{name} ({own}) imports {m} ({other}, a floor above)")
            elif FLOOR_OF[other] == FLOOR_OF[own]:
                found.append(f"{name} ({own}) imports {m} ({other}, a sibling)")
    return found


def package_modules() -> dict[str, set[str]]:
    return {
        module_name(p): imported_modules(p.read_text(), module_name(p), p.name == "__init__.py")
        for p in ROOT.rglob("*.py")
    }


def test_every_module_belongs_to_a_layer():
    modules = package_modules()
    assert "streambandit.engine.partition" in modules and "streambandit.stream.worker" in modules
    assert [m for m in modules if m != FACE and layer_of(m) is None] == []


def test_imports_only_run_down_the_floors():
    assert violations(package_modules()) == []


def test_no_module_imports_itself_back():
    """No circle between two modules of the package (function-level imports included): each pair
    that imports the other is a layering knot inside a folder."""
    modules = package_modules()
    # A package's __init__ only hands names on; a module importing its own package's face is no circle.
    known = {p for p in modules if not (ROOT.parent / p.replace(".", "/") / "__init__.py").exists()}
    edges = {
        name: {m for m in imports if m in known and m != name}
        for name, imports in modules.items()
        if name in known
    }
    circles = sorted(
        f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, ())
    )
    assert circles == []


def test_the_direction_check_sees_up_sideways_and_the_client():
    """An import up a floor, one between siblings and the Kafka client in a pure layer are each
    caught, also through a relative or function-level import."""
    bad = {
        "streambandit.replay.runner": imported_modules(
            "def f():\n    from ..stream import worker\n", "streambandit.replay.runner"
        ),
        "streambandit.stream.worker": imported_modules(
            "import streambandit.serving.replica\n", "streambandit.stream.worker"
        ),
        "streambandit.policies.oful": imported_modules(
            "from streambandit.engine.partition import PartitionEngine\n",
            "streambandit.policies.oful",
        ),
        "streambandit.engine.merge": imported_modules(
            "from confluent_kafka import Consumer\n", "streambandit.engine.merge"
        ),
        "streambandit.cli.commands": imported_modules(
            "from streambandit.stream import worker\n", "streambandit.cli.commands"
        ),
    }
    assert violations(bad) == [
        "streambandit.engine.merge (engine) imports the Kafka client",
        "streambandit.policies.oful (policies) imports streambandit.engine.partition (engine, a floor above)",
        "streambandit.policies.oful (policies) imports streambandit.engine.partition.PartitionEngine "
        "(engine, a floor above)",
        "streambandit.replay.runner (replay) imports streambandit.stream (stream, a sibling)",
        "streambandit.replay.runner (replay) imports streambandit.stream.worker (stream, a sibling)",
        "streambandit.stream.worker (stream) imports streambandit.serving.replica (serving, a floor above)",
    ]


# -- the pure layers import with the Kafka client blocked ------------------------------------------

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


def pure_modules() -> list[str]:
    return sorted(m for m in package_modules() if m == FACE or layer_of(m) not in KAFKA_LAYERS)


def test_the_pure_layers_import_without_the_kafka_client():
    pure = pure_modules()
    assert "streambandit.engine.partition" in pure and "streambandit.replay.runner" in pure
    out = subprocess.run(
        [sys.executable, "-c", BLOCK, *pure], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_blocker_really_blocks():
    out = subprocess.run(
        [sys.executable, "-c", BLOCK, "streambandit.stream.worker"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "confluent_kafka is blocked" in out.stderr
