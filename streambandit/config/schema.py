"""Every setting of the worker's configuration file: its table, type, allowed range, default and
what it is for, in one place (pure, no I/O).

The dataclasses (config/worker.py, config/app.py, config/models.py) take their defaults from
here and check their values with :meth:`Setting.check`; the environment (config/environment.py)
parses its text with :meth:`Setting.from_text`. A setting added here is validated, overridable
from the environment and printed by ``serve --print-config`` without another change.

``[kafka]`` holds librdkafka's own settings, which librdkafka judges (stream/kafka_checks.py);
which of them are credentials: :func:`is_secret`, from redaction.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from streambandit.policies.base import POLICIES
from streambandit.redaction import MASK, is_secret

__all__ = [
    "REQUIRED",
    "Setting",
    "SETTINGS",
    "TABLES",
    "table",
    "check_table",
    "is_secret",
    "MASK",
]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a setting that has none: the file must give it.
REQUIRED: Any = _Required()

_KIND_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One key of one table: its type (``kind``: int, float, bool or str), the values allowed
    (``low``/``high`` bounds, ``low_open`` excludes ``low``; ``choices``; a str is non-empty),
    whether it may be left unset (``optional``: None) and its default."""

    table: str
    key: str
    kind: str
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False
    phrase: str = ""  # says what is allowed, where the range's own words would not

    @property
    def range(self) -> str:
        """The values allowed among those of the setting's type ("> 0", "in [0, 1]", ...)."""
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        if self.kind == "str":
            return "a non-empty string"
        if self.kind == "bool":
            return "true or false"
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return "finite" if self.kind == "float" else "any"

    @property
    def allowed(self) -> str:
        """The type and the values allowed, as the documentation and a wrong type's error say."""
        if self.phrase:
            return self.phrase
        text = self.range
        if self.kind in ("int", "float"):
            text = f"{_KIND_TEXT[self.kind]}{'' if text == 'any' else ' ' + text}"
        return text + (" (or unset)" if self.optional else "")

    def check(self, value: Any, where: str | None = None) -> None:
        """ValueError, one line naming the key and what is allowed, unless ``value`` is one: its
        type and range for a value of another type, its range for one out of it."""
        if value is None and self.optional:
            return
        if not self._fits(value):
            typed = self._typed(value)
            allowed = self.range if typed and not self.phrase else self.allowed
            raise ValueError(
                f"{where or f'[{self.table}]'} {self.key} must be {allowed}, got {value!r}"
            )

    def _typed(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str)
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        return number and (self.kind == "float" or isinstance(value, int))

    def _fits(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            ok = isinstance(value, str) and value != ""
            return ok and (not self.choices or value in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high

    def from_text(self, text: str, where: str) -> Any:
        """The value an environment variable's ``text`` gives this setting (then checked)."""
        value: Any = text
        if self.optional and text.strip() == "":
            value = None
        elif self.kind == "bool":
            value = {"true": True, "false": False}.get(text.strip().lower(), text)
        elif self.kind in ("int", "float"):
            try:
                value = int(text) if self.kind == "int" else float(text)
            except ValueError:
                pass  # left a string: check() names the key and the type
        self.check(value, where)
        return value


def _w(key: str, kind: str, default: Any, description: str, **range_: Any) -> Setting:
    return Setting("worker", key, kind, default, description, **range_)


# Why each bound and default is what it is, in its description: `python -m
# streambandit.config.schema` prints them all as a table.
SETTINGS: tuple[Setting, ...] = (
    _w(
        "group_id",
        "str",
        "streambandit",
        "the consumer group, and the prefix of the workers' transactional ids",
    ),
    _w(
        "batch_max_records",
        "int",
        5000,
        "the most records one transaction takes; under a backlog each commit waits for a few "
        "broker round trips, so a larger bound means fewer of them (bench.e2e part 4), and under "
        "light load a batch is what one fetch brought",
        low=1,
    ),
    _w(
        "poll_timeout_ms",
        "int",
        50,
        "how long an idle loop waits for a first record before it goes round again",
        low=1,
    ),
    _w(
        "merge_wait_ms",
        "int",
        20,
        "how long a record waits for the other input's head (docs/design.md, merge order)",
        low=0,
    ),
    _w(
        "idle_tick_ms",
        "int",
        1000,
        "an idle partition with open decisions gets a watermark tick this often",
        low=1,
    ),
    _w(
        "idle_commit_ms",
        "int",
        1000,
        "a partition without input this long is idle: its processed input is committed and it is "
        "snapshotted at the end of its input (Worker._commit_idle)",
        low=1,
    ),
    _w(
        "snapshot_interval_s",
        "float",
        30.0,
        "a partition is snapshotted at least this often while it changes",
        low=0,
        low_open=True,
    ),
    _w(
        "snapshot_every_updates",
        "int",
        100_000,
        "or after this many updates: bounds the joined records recovery re-applies after the "
        "snapshot (bench.recovery), while a snapshot pauses the partition's loop (e2e part 6)",
        low=1,
    ),
    _w(
        "snapshot_max_share",
        "float",
        0.1,
        "at most this share of a partition's time goes to snapshotting it: a snapshot costs time "
        "in proportion to the partition's models (bench.memory), which the triggers above ignore",
        low=0,
        high=1,
        low_open=True,
    ),
    _w(
        "snapshot_base_every",
        "int",
        32,
        "a snapshot holds the models changed since the previous one (an increment) unless the "
        "chain has this many increments (engine/chains.py; 0: every snapshot a base)",
        low=0,
    ),
    _w(
        "snapshot_fork_models",
        "int",
        1000,
        "a snapshot of at least this many models is taken by a forked child (Linux, a directory "
        "store): the loop pauses for the fork, not for a copy of the models (bench.snapshots); "
        "the child may cost up to the worker's size again in copied memory (0: never fork)",
        low=0,
    ),
    _w(
        "snapshot_topic",
        "str",
        None,
        "keep snapshots in this compacted topic (or snapshot_dir)",
        optional=True,
    ),
    _w(
        "snapshot_dir",
        "str",
        None,
        "keep snapshots in this directory (one machine; or snapshot_topic)",
        optional=True,
    ),
    _w(
        "snapshot_max_chunk_bytes",
        "int",
        512 * 1024,
        "snapshots larger than this go in several records (half of Kafka's default largest "
        "message, leaving room for the header and key)",
        low=1,
    ),
    _w("max_pending", "int", 100_000, "the most open decisions of a partition", low=1),
    _w(
        "max_early_rewards",
        "int",
        10_000,
        "the most rewards of a partition held for a decision not yet seen",
        low=0,
    ),
    _w(
        "max_recent",
        "int",
        100_000,
        "the most closed decisions of a partition remembered, to recognise a late reward",
        low=0,
    ),
    _w(
        "max_id_bytes",
        "int",
        1024,
        "the longest id a client may send (reason code id_too_long): ids that fit any output record",
        low=1,
    ),
    _w(
        "max_event_time_ahead_ms",
        "int",
        3_600_000,
        "how far an event time may be ahead of its record's Kafka timestamp (reason code "
        "event_time_ahead; give the input topics message.timestamp.type LogAppendTime)",
        low=0,
    ),
    _w(
        "max_models",
        "int",
        1_000_000,
        "the most models one partition holds; a context of a new key past it is dead-lettered "
        "too_many_models (memory per model: docs/operations.md)",
        low=1,
    ),
    _w(
        "max_dead_letter_bytes",
        "int",
        256 * 1024,
        "the largest record copied whole into a dead letter (a larger one is cut, with its "
        "length and digest); below the producer's message.max.bytes",
        low=1,
    ),
    _w(
        "stall_report_s",
        "float",
        60.0,
        "how long the worker may hold no partition while its inputs have lag, or see the group's "
        "committed offsets behind its own commits, before it says so (stream/stall.py)",
        low=0,
        low_open=True,
    ),
    _w(
        "group_protocol",
        "str",
        "auto",
        "the consumer group protocol: consumer (KIP-848, incremental: partitions that do not move "
        "keep being served during a rebalance), classic (eager range assignor: every partition "
        "stops for a rebalance), or auto (consumer where the broker offers it)",
        choices=("auto", "consumer", "classic"),
    ),
    _w(
        "static_membership",
        "bool",
        False,
        "a static member of the group (KIP-345), its id the worker's transactional id: a worker "
        "restarting within session.timeout.ms gets its partitions back without a rebalance",
    ),
    _w(
        "metrics_port",
        "int",
        None,
        "/metrics, /healthz and /ready on this port (unset: no endpoint; 0: any free port)",
        low=0,
        high=65535,
        optional=True,
    ),
    _w("metrics_host", "str", "0.0.0.0", "the address the metrics endpoint listens on"),
    _w(
        "health_timeout_s",
        "float",
        60.0,
        "/healthz fails when the loop made no progress for this long (an idle loop goes round "
        "every poll_timeout_ms)",
        low=0,
        low_open=True,
    ),
    _w(
        "log_summary_s",
        "float",
        60.0,
        "a one-line summary of rates, lag and dead letters at INFO this often (0: never)",
        low=0,
    ),
    _w(
        "broker_wait_s",
        "float",
        30.0,
        "how long to wait at start-up for a broker of bootstrap.servers to answer before one "
        "error line and exit code 1",
        low=0,
        low_open=True,
    ),
    _w(
        "learn_only",
        "bool",
        False,
        "decide nothing: learn from the decisions replicas log on topics.decisions "
        "(serving/replica.py)",
    ),
    *(
        Setting("topics", key, "str", default, description)
        for key, default, description in (
            ("contexts", "contexts", "the requests to decide on"),
            ("rewards", "rewards", "the rewards of decisions"),
            ("actions", "actions", "the decisions made (or, learn-only, taken from replicas)"),
            ("joined", "joined", "each decision with its reward, once its window closed"),
            ("dead_letter", "dead-letter", "records refused, with the reason"),
            ("decisions", "decisions", "a learn-only worker's first input, logged by replicas"),
        )
    ),
    Setting("models", "match", "str", REQUIRED, "an exact model key or a shell-style pattern"),
    Setting(
        "models",
        "policy",
        "str",
        REQUIRED,
        "the learner (streambandit.policies)",
        choices=tuple(sorted(POLICIES)),
    ),
    Setting(
        "models",
        "dim",
        "int",
        REQUIRED,
        "the feature dimension of an arm",
        low=1,
        phrase="an integer >= 1",
    ),
    Setting(
        "models",
        "reward_window_ms",
        "int",
        REQUIRED,
        "event time from the decision until its reward window closes",
        low=1,
        phrase="a positive integer",
    ),
    Setting(
        "models",
        "default_reward",
        "float",
        REQUIRED,
        "the reward applied when the window closes with none (one the policy accepts)",
    ),
    Setting(
        "models",
        "aggregation",
        "str",
        "first",
        "which reward counts when several arrive for one event",
        choices=("first", "last", "sum"),
    ),
    Setting(
        "models",
        "epsilon",
        "float",
        0.0,
        "uniform exploration mixed over the policy's choice (0: none)",
        low=0,
        high=1,
    ),
    Setting(
        "models",
        "seed",
        "int",
        0,
        "seeds the exploration draws and the policy",
        low=0,
        high=2**32 - 1,
    ),
)

#: The tables of the file, each with its kind: settings of this module, a list of tables
#: ([[models]], each with ``hyper``: the policy's keyword arguments, judged by the policy) or
#: librdkafka's settings.
TABLES = {"kafka": "librdkafka", "worker": "settings", "topics": "settings", "models": "list"}


def table(name: str) -> dict[str, Setting]:
    """The settings of table ``name`` by key."""
    return {s.key: s for s in SETTINGS if s.table == name}


def check_table(name: str, values: dict[str, Any], where: str | None = None) -> None:
    """ValueError, one line, at the first key of ``values`` the table does not have or the first
    value it does not allow."""
    settings = table(name)
    where = where or f"[{name}]"
    unknown = sorted(set(values) - set(settings))
    if unknown:
        noun = "key(s)" if name == "topics" else "setting(s)"  # [topics] keys name topics
        raise ValueError(
            f"{where} has unknown {noun} {', '.join(unknown)}; known: {', '.join(sorted(settings))}"
        )
    for key, value in values.items():
        settings[key].check(value, where)


def markdown() -> str:
    """Every setting as a markdown table: table, key, type and range, default, description."""
    rows = ["| setting | allowed | default | what it is for |", "|---|---|---|---|"]
    for s in SETTINGS:
        name = f"[[models]] {s.key}" if s.table == "models" else f"[{s.table}] {s.key}"
        default = (
            "required" if s.default is REQUIRED else "unset" if s.default is None else s.default
        )
        rows.append(f"| `{name}` | {s.allowed} | `{default}` | {s.description} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
