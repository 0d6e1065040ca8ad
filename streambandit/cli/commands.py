"""The ``streambandit`` command line. The only module that reads the environment or prints."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Bit-exact replay needs the same floating-point reduction order every run; a multi-threaded BLAS
# may split a product differently from run to run. Set before numpy is imported anywhere.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def _cmd_simulate_ads(args: argparse.Namespace) -> int:
    """In-process ad simulation: the learner against the best and random choice, live figures."""
    import numpy as np

    from streambandit import make_policy
    from streambandit.sim.ads import AdTraffic, ad_hyper

    traffic = AdTraffic(dim=args.dim, k=args.arms, seed=args.seed)
    hyper = ad_hyper(args.policy)
    if args.beta_scale is not None:
        hyper["beta_scale"] = args.beta_scale
    policy = make_policy(args.policy, dim=args.dim, **hyper)
    rng = np.random.default_rng(args.seed)
    clicks = best = rand = 0.0
    start = last = time.perf_counter()
    n = 0
    print(f"{policy!r}; {args.arms} candidate ads per request; Ctrl-C to stop")
    print(f"{'requests':>9} {'req/s':>8} {'CTR learner':>12} {'CTR best':>9} {'CTR random':>11}")
    try:
        while n < args.requests and time.perf_counter() - start < args.duration:
            req = traffic.request(rng)
            i = policy.select(req.features)
            click = traffic.click(rng, float(req.click_rates[i]))
            policy.update(req.features[i], float(click))
            clicks += float(
                req.click_rates[i]
            )  # expected CTR of the choice: less noisy than clicks
            best += float(req.click_rates.max())
            rand += float(req.click_rates.mean())
            n += 1
            now = time.perf_counter()
            if now - last >= 1.0 or n == args.requests:
                print(
                    f"{n:>9} {n / (now - start):>8.0f} {clicks / n:>12.4f} {best / n:>9.4f} {rand / n:>11.4f}",
                    flush=True,
                )
                last = now
    except KeyboardInterrupt:
        print("stopped")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    """A worker in a consumer group, until SIGTERM/SIGINT (then it snapshots and leaves cleanly)."""
    import dataclasses
    import logging
    import signal

    # A stop asked for while the worker is still being built (a supervisor stopping a child it has
    # just restarted) is kept and honoured once the worker exists: the process stops cleanly and
    # reports, rather than dying of the signal's default action halfway through its start.
    stop_asked: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop_asked.append(signum))

    from streambandit.config.app import load_worker_config
    from streambandit.log_format import configure_logging
    from streambandit.stream.kafka_checks import check_client_settings, wait_for_brokers
    from streambandit.stream.snapshots import TopicStore
    from streambandit.stream.worker import Worker

    configure_logging(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
    config, snaps = load_worker_config(args.config, bootstrap_servers=args.bootstrap_servers)
    if args.metrics_port is not None:
        config = dataclasses.replace(config, metrics_port=args.metrics_port)
    check_client_settings(config, source=f"{args.config} [kafka]")
    if args.print_config:
        from streambandit.config.app import dump_worker_config

        if args.snapshot_topic or args.snapshot_dir:  # the command line's store replaces the file's
            snaps = dataclasses.replace(snaps, topic=args.snapshot_topic, dir=args.snapshot_dir)
        print(dump_worker_config(config, snaps), end="")
        return 0
    if args.check_config:
        models = ", ".join(f"{m.match} ({m.policy}, d={m.dim})" for m in config.models.specs)
        topics = ", ".join(config.topics.all(config.learn_only))
        print(f"{args.config}: valid. group {config.group_id}, topics {topics}, models {models}")
        return 0
    wait_for_brokers(
        config
    )  # one error line if none answers, before any store or worker process starts
    instance = args.instance_id or socket.gethostname()
    processes = args.processes if args.processes is not None else len(os.sched_getaffinity(0))
    store = _snapshot_store(config, snaps, args.snapshot_topic, args.snapshot_dir)
    if processes != 1:  # the store was opened to check it; each worker process opens its own
        if isinstance(store, TopicStore):
            store.close()
        return _supervise(args, instance, processes, config.metrics_port)
    try:
        worker = Worker(config, store, instance_id=instance)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        if stop_asked:
            worker.stop()
        worker.run(max_seconds=args.duration)
    finally:
        if isinstance(store, TopicStore):
            store.close()
    print(" ".join(f"{k}={v}" for k, v in sorted(worker.metrics.items())), flush=True)
    return 0


def _supervise(
    args: argparse.Namespace, instance: str, processes: int, metrics_port: int | None
) -> int:
    """``serve --processes N``: N workers, each a ``serve --processes 1`` child with the instance
    id ``<instance>-<i>`` (stream/supervisor.py), until SIGTERM/SIGINT or ``--duration``. With a
    metrics port P, child i serves on P + i (P = 0: each on a free port of its own)."""
    import signal

    from streambandit.stream.supervisor import Supervisor

    if processes < 1:
        raise ValueError(f"--processes must be >= 1, got {processes}")
    same = (
        [
            a
            for name, value in (
                ("--config", args.config),
                ("--bootstrap-servers", args.bootstrap_servers),
                ("--snapshot-topic", args.snapshot_topic),
                ("--snapshot-dir", args.snapshot_dir),
            )
            if value
            for a in (name, str(value))
        ]
        + (["-v"] if args.verbose else [])
        + ["--log-format", args.log_format]
    )

    def command(i: int) -> list[str]:
        port = (
            []
            if metrics_port is None
            else ["--metrics-port", str(metrics_port + i if metrics_port else 0)]
        )
        return [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            *same,
            *port,
            "--processes",
            "1",
            "--instance-id",
            f"{instance}-{i}",
        ]

    supervisor = Supervisor(command, processes)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.stop())
    code = supervisor.run(max_seconds=args.duration)
    print(f"processes={processes} restarts={supervisor.restarts}", flush=True)
    return code


def _reach_brokers(config: Any, path: str) -> None:
    """What every command that talks to a broker does first, as ``serve`` does: librdkafka
    judges the ``[kafka]`` settings (one line naming a bad key, exit 2), then a broker must
    answer within ``[worker] broker_wait_s`` (one line, exit 1), librdkafka's own connection
    lines held back (stream/kafka_checks.py); later ones are log lines on stderr, warnings and
    errors only unless the command set up its logging already."""
    import logging

    from streambandit.log_format import configure_logging
    from streambandit.stream.kafka_checks import check_client_settings, wait_for_brokers

    if not logging.getLogger().handlers:
        configure_logging(logging.WARNING)
    check_client_settings(config, source=f"{path} [kafka]")
    wait_for_brokers(config)


def _cmd_topics(args: argparse.Namespace) -> int:
    """Create or describe every topic a worker configuration names (snapshot topic included)."""
    from streambandit.config.app import load_worker_config
    from streambandit.log_format import error_line
    from streambandit.stream.topics_admin import create_topics, describe_topics

    config, snaps = load_worker_config(args.config, bootstrap_servers=args.bootstrap_servers)
    if args.dry_run and args.action != "create":
        raise ValueError("--dry-run is for topics create")
    _reach_brokers(config, args.config)
    if args.action == "create":
        statuses = create_topics(
            config.bootstrap_servers,
            config.kafka,
            config.topics,
            snaps.topic,
            args.partitions,
            args.replication,
            max_chunk_bytes=snaps.max_chunk_bytes,
            learn_only=config.learn_only,
            dry_run=args.dry_run,
        )
        for st in statuses:
            print(f"{st.topic}: {st}")
        if args.dry_run:
            print("dry run: nothing created or changed")
        differ = [st.topic for st in statuses if st.partitions_differ]
        if differ:
            # Left as they are: adding partitions would move model keys, and their state would
            # not follow (deploy/README.md).
            error_line(
                f"partition counts differ from --partitions {args.partitions}: {', '.join(differ)}; "
                "the worker needs every topic with one partition count"
            )
            return 1
        return 0
    rows, co_partitioned = describe_topics(
        config.bootstrap_servers,
        config.kafka,
        config.topics,
        snaps.topic,
        learn_only=config.learn_only,
    )
    for topic, n in rows:
        print(f"{topic}: {'missing' if n is None else f'{n} partitions'}")
    print(
        "co-partitioned: "
        + (
            "yes"
            if co_partitioned
            else "NO (the worker needs every topic, with one partition count)"
        )
    )
    return 0 if co_partitioned else 1


def _cmd_status(args: argparse.Namespace) -> int:
    """Where a worker group stands: owner, committed and end offsets, lag and the newest
    snapshot of each input partition (stream/group_status.py)."""
    import json

    from streambandit.config.app import load_worker_config
    from streambandit.stream.group_status import format_table, read_group_status
    from streambandit.stream.snapshots import TopicStore

    config, snaps = load_worker_config(args.config, bootstrap_servers=args.bootstrap_servers)
    _reach_brokers(config, args.config)
    store = _snapshot_store(config, snaps, args.snapshot_topic, args.snapshot_dir)
    where = f"topic {store.topic}" if isinstance(store, TopicStore) else f"directory {store.path}"
    try:
        status = read_group_status(config, store, where)
    finally:
        if isinstance(store, TopicStore):
            store.close()
    print(json.dumps(status.as_dict(), indent=2) if args.json else format_table(status))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """The whole loop on the embedded broker (Apache Kafka with --kafka): a simulated ad server and
    a worker, live figures."""
    from pathlib import Path

    from streambandit.dev.demo import DemoConfig, run_demo

    if args.kafka:
        from streambandit.dev.kafka_jars import check_prerequisites, is_cached

        check_prerequisites()  # a missing java or mvn is the one line
        if not is_cached():
            print("fetching Apache Kafka's jars with Maven (once)", flush=True)
    run_demo(
        DemoConfig(
            duration_s=args.duration,
            rate_per_s=args.rate,
            policy=args.policy,
            dim=args.dim,
            arms=args.arms,
            partitions=args.partitions,
            seed=args.seed,
            out_dir=Path(args.out),
            edge=args.edge,
            kafka=args.kafka,
        )
    )
    return 0


def _snapshot_store(config: Any, snaps: Any, topic_arg: str | None, dir_arg: str | None) -> Any:
    """The snapshot store a configuration names, or the one the command line names instead."""
    from streambandit.stream.snapshots import DirectoryStore, SnapshotStoreError, TopicStore

    # A command-line choice replaces the file's, whichever kind of store either names.
    topic = topic_arg or (None if dir_arg else snaps.topic)
    directory = dir_arg or (None if topic_arg else snaps.dir)
    if topic:
        try:
            return TopicStore(
                config.bootstrap_servers,
                topic,
                kafka=config.kafka,
                max_chunk_bytes=snaps.max_chunk_bytes,
            )
        except SnapshotStoreError as exc:
            raise ValueError(str(exc)) from None
    if directory:
        return DirectoryStore(directory)
    raise ValueError(
        "no snapshot store: set [worker] snapshot_topic (a compacted topic) or snapshot_dir, "
        "or pass --snapshot-topic or --snapshot-dir"
    )


def _cmd_api(args: argparse.Namespace) -> int:
    """Rank and reward over HTTP from an in-process Decider (streambandit/serving/api.py)."""
    import logging

    try:
        from streambandit.serving.api import serve_api
    except ImportError as exc:  # aiohttp is an optional dependency
        raise ValueError(
            f"streambandit api needs aiohttp: pip install 'streambandit[api]' ({exc})"
        ) from None
    from streambandit.log_format import configure_logging

    configure_logging(logging.INFO, args.log_format)
    if (args.models is None) == (args.replica_of is None):
        raise ValueError(
            "give --models (decide and learn in this process) or --replica-of (decide with a replica "
            "of a learn-only group's models), not both"
        )
    gate, ssl_context = _api_access(args)
    if args.replica_of is not None:
        from streambandit.config.app import load_worker_config
        from streambandit.serving.api import serve_replica
        from streambandit.serving.replica import Replica

        config, snaps = load_worker_config(
            args.replica_of, bootstrap_servers=args.bootstrap_servers
        )
        if not config.learn_only:
            raise ValueError(
                f"{args.replica_of}: [worker] learn_only is not true: a replica follows a learn-only group "
                "(its workers would decide again what the replicas decided)"
            )
        _reach_brokers(config, args.replica_of)
        replica = Replica(
            config,
            _snapshot_store(config, snaps, args.snapshot_topic, args.snapshot_dir),
            max_models=args.max_models,
            max_staleness_s=args.max_staleness,
        )
        serve_replica(
            replica,
            host=args.host,
            port=args.port,
            model_key=args.model_key,
            gate=gate,
            ssl_context=ssl_context,
        )
        return 0
    if args.snapshot_topic or args.snapshot_dir:
        raise ValueError(
            "--snapshot-topic and --snapshot-dir name the learners' store: use them with --replica-of"
        )
    bound = {} if args.max_models is None else {"max_models": args.max_models}
    serve_api(
        args.models,
        host=args.host,
        port=args.port,
        model_key=args.model_key,
        snapshot=args.snapshot,
        save_every_s=args.save_every,
        gate=gate,
        ssl_context=ssl_context,
        **bound,
    )
    return 0


def _api_access(args: argparse.Namespace) -> tuple[Any, Any]:
    """The api's gate (its API keys, open paths and budgets; None without keys) and its TLS
    context (None: plain HTTP); refuses a non-loopback address without keys (docs/security.md)."""
    from streambandit.serving import auth
    from streambandit.serving.tls import server_context

    keys = auth.load_keys(args.api_keys, os.environ)
    refusal = auth.listen_refusal(args.host, keys is not None, args.insecure)
    if refusal is not None:
        raise ValueError(refusal)
    ssl_context = server_context(args.tls_cert, args.tls_key)
    if keys is None:
        given = [
            o
            for o, v in (
                ("--open-paths", args.open_paths),
                ("--rate-limit", args.rate_limit),
                ("--burst", args.burst),
            )
            if v is not None
        ]
        if given:
            raise ValueError(f"{given[0]} applies to API keys, and none is configured (--api-keys)")
        return None, ssl_context
    gate = auth.Gate(
        keys,
        open_paths=auth.parse_open_paths(args.open_paths)
        if args.open_paths is not None
        else auth.DEFAULT_OPEN_PATHS,
        rate_per_s=auth.DEFAULT_RATE_PER_S if args.rate_limit is None else args.rate_limit,
        burst=auth.DEFAULT_BURST if args.burst is None else args.burst,
    )
    return gate, ssl_context


def _cmd_export(args: argparse.Namespace) -> int:
    """The worker's logs (contexts, actions, joined) of a group as one Avro file of logged decisions."""
    from streambandit.config.app import load_worker_config
    from streambandit.export import read_logged_decisions
    from streambandit.replay.files import write_avro

    config, _ = load_worker_config(args.config, bootstrap_servers=args.bootstrap_servers)
    partitions = [int(p) for p in args.partitions.split(",")] if args.partitions else None
    _reach_brokers(config, args.config)
    decisions = read_logged_decisions(
        config.bootstrap_servers,
        config.topics,
        config.group_id,
        partitions=partitions,
        from_ms=args.from_ms,
        to_ms=args.to_ms,
        kafka=config.kafka,
        learn_only=config.learn_only,
    )
    n = write_avro(args.out, decisions)
    print(f"wrote {n} logged decisions of group {config.group_id!r} to {args.out}")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    """A paper's experiment (or all of them) in the simulator: CSV, PNG and a Markdown summary."""
    from streambandit.progress import ProgressBar
    from streambandit.sim.experiments import EXPERIMENTS, load
    from streambandit.sim.experiments.base import write_result

    size = "full" if args.full else "tiny" if args.tiny else "default"
    if args.seeds is not None and args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    modules = [load(n) for n in names]  # an unknown name fails before any work
    for name, module in zip(names, modules):
        bar = ProgressBar(module.total_rounds(size=size, seeds=args.seeds), label=name)
        result = module.run(size=size, seeds=args.seeds, progress=bar.advance)
        bar.close()
        written = write_result(result, args.out, size=size)
        print(result.summary.strip() + "\n")
        print("wrote " + ", ".join(str(p) for p in written), flush=True)
    return 0


def _cmd_broker(args: argparse.Namespace) -> int:
    """A development broker in the foreground: the embedded one, or Apache Kafka (--kafka)."""
    import signal

    if not args.kafka and (args.nodes is not None or args.data_dir is not None):
        raise ValueError("--nodes and --data-dir are for Apache Kafka: add --kafka")
    if args.nodes is not None and args.nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {args.nodes}")
    # SIGINT (Ctrl-C) and SIGTERM stop the broker, set here rather than inherited: a process
    # started in the background by a non-interactive shell inherits SIGINT ignored, and then
    # nothing would stop it but SIGKILL, leaving the broker behind.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    if args.kafka:
        from streambandit.dev.kafka import ApacheKafka
        from streambandit.dev.kafka_jars import cache_root, check_prerequisites, is_cached

        b = ApacheKafka(
            nodes=1 if args.nodes is None else args.nodes, port=args.port, data_dir=args.data_dir
        )
        check_prerequisites()  # a missing java or mvn is the one line, before any other
        if (
            not is_cached()
        ):  # the one slow start: say why it is slow (stderr: stdout's first line is the address)
            print(
                f"fetching Apache Kafka {b.version}'s jars with Maven into {cache_root() / b.version} (once)",
                file=sys.stderr,
                flush=True,
            )
    else:
        from streambandit.dev.tansu import EmbeddedBroker

        b = EmbeddedBroker(port=args.port)
    try:  # a signal at any point from here stops the broker (b.wait() handles it once it waits)
        b.start()
        if args.kafka:
            nodes = f"{b.node_count} nodes" if b.node_count > 1 else "one node"
            print(
                f"Apache Kafka {b.version} listening ({nodes}, ready in {b.last_start_s:.1f} s): "
                f"bootstrap.servers={b.bootstrap_servers} (data and logs: {b.data_dir}); Ctrl-C stops it",
                flush=True,
            )
        else:
            print(
                f"embedded broker listening: bootstrap.servers={b.bootstrap_servers} (log: {b.log_path}); "
                "Ctrl-C stops it",
                flush=True,
            )
        if args.create_topics:
            _broker_topics(b.bootstrap_servers, args, embedded=not args.kafka)
        code = b.wait()
    except KeyboardInterrupt:
        b.stop()
        return 0
    from streambandit.dev.tansu import BrokerError

    logs = f"data and logs: {b.data_dir}" if args.kafka else f"log: {b.log_path}"
    raise BrokerError(f"the broker stopped by itself with exit code {code} ({logs})")


def _broker_topics(bootstrap: str, args: argparse.Namespace, embedded: bool) -> None:
    """``broker --create-topics``: the topics of ``--config`` (or the default names and the
    snapshot topic ``streambandit-snapshots``), and the client settings this broker needs."""
    from streambandit.config.app import load_worker_config
    from streambandit.config.worker import Topics
    from streambandit.stream.topics_admin import create_topics

    topics, snapshot_topic, learn_only = Topics(), "streambandit-snapshots", False
    if args.config:
        config, snaps = load_worker_config(args.config, bootstrap_servers=bootstrap)
        topics, snapshot_topic, learn_only = config.topics, snaps.topic, config.learn_only
    for st in create_topics(
        bootstrap, {}, topics, snapshot_topic, args.partitions, learn_only=learn_only
    ):
        print(f"{st.topic}: {st}", flush=True)
    settings = f'  [kafka]\n  "bootstrap.servers" = "{bootstrap}"'
    if embedded:
        # A fetch on this broker waits its whole fetch.wait.max.ms even when records are there
        # (docs/notes/tansu.md): the worker's configuration for it needs a small one. Apache
        # Kafka answers as soon as a record is there, with librdkafka's defaults.
        settings += '\n  [kafka.consumer]\n  "fetch.wait.max.ms" = 10'
    print(f"client settings for this broker, in the worker's TOML:\n{settings}", flush=True)


_LOG_FORMATS = ("csv", "avro", "obd", "dsjson")


def _log_format(path, given: str | None) -> str:
    if given:
        return given
    if path.is_dir():
        return "obd"
    suffixes = [x.lower() for x in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    suffix = suffixes[-1] if suffixes else ""
    known = {
        ".csv": "csv",
        ".avro": "avro",
        ".json": "dsjson",
        ".jsonl": "dsjson",
        ".dsjson": "dsjson",
    }
    if suffix not in known:
        raise ValueError(
            f"log {path}: unknown format {suffix or '(no extension)'!r}; expected .csv, .avro, "
            ".json/.dsjson (DSJSON) or an Open Bandit Dataset directory, or say --format"
        )
    return known[suffix]


# DSJSON's hashing dimension when only external targets read the log: their probabilities are
# given, so the features feed only the reward model of dm and dr (a ridge of this dimension).
EXTERNAL_HASH_DIM = 32


def _replay_source(
    args: argparse.Namespace, counts: dict, dim: int | None, *, configured: bool = True
):
    """The logged decisions ``streambandit replay`` reads, and a name for them in the report.

    LOG is a ``.csv`` (inline features or ``--catalog``), ``.avro``, DSJSON (``.json``,
    ``.dsjson``, ``.gz``) file or an Open Bandit Dataset directory (docs/replay_formats.md).
    ``dim``: the targets' dimension, DSJSON's hashing dimension unless ``--hash-dim`` says.
    ``configured``: whether a configured (learning or frozen) target reads the features; without
    one DSJSON is hashed into :data:`EXTERNAL_HASH_DIM` buckets unless ``--hash-dim`` says.
    Other sources (e.g. a Kafka topic range) plug in here: return an iterable of
    LoggedDecision in log order. The third value tells how much of the file is read (None
    for a format that does not say)."""
    from pathlib import Path

    from streambandit.replay import files

    share = files.ReadShare()

    path = Path(args.log)
    if not path.exists():
        raise ValueError(f"log {path} does not exist")
    fmt = _log_format(path, args.format)
    if args.catalog and fmt != "csv":
        raise ValueError(
            f"--catalog applies to CSV logs only ({fmt} logs carry their arms' features)"
        )
    if fmt == "csv":
        from streambandit.replay import csv_columnar

        if not csv_columnar.AVAILABLE:
            print(
                "reading the CSV with Python's csv module; with pyarrow installed "
                "(pip install 'streambandit[arrow]') it is read column by column, several times "
                "faster (python -m bench.replay_csv)",
                file=sys.stderr,
            )
        return (
            files.read_csv(
                path,
                args.catalog,
                skip_bad=args.skip_bad,
                counts=counts,
                combine=args.combine,
                hash_dim=args.hash_dim or 0,
                share=share,
            ),
            str(path),
            share,
        )
    if fmt == "avro":
        return (
            files.read_avro(path, skip_bad=args.skip_bad, counts=counts, share=share),
            str(path),
            share,
        )
    if fmt == "obd":
        from streambandit.replay.obd import read_obd

        return (
            read_obd(
                path,
                model_key=args.model_key or "obd",
                user_dim=args.user_dim,
                combine=args.combine,
                affinity=args.affinity,
                skip_bad=args.skip_bad,
                counts=counts,
                share=share,
            ),
            str(path),
            share,
        )
    from streambandit.replay.dsjson import read_dsjson

    hash_dim = args.hash_dim or dim or (None if configured else EXTERNAL_HASH_DIM)
    if not hash_dim:
        raise ValueError(
            "a DSJSON log needs --hash-dim (or a --config whose model sets the dimension)"
        )
    return (
        read_dsjson(
            path,
            dim=hash_dim,
            model_key=args.model_key or "dsjson",
            skip_bad=args.skip_bad,
            counts=counts,
        ),
        str(path),
        None,
    )


def _named(value: str, what: str) -> tuple[str, str]:
    """``NAME=PATH``, or a bare PATH named by its file's stem."""
    from pathlib import Path

    name, sep, path = value.partition("=")
    if not sep:
        name, path = Path(value).stem, value
    if not name or not path:
        raise ValueError(f"{what} {value!r}: expected NAME=PATH or PATH")
    return name, path


def _replay_targets(args: argparse.Namespace):
    """The targets of ``streambandit replay``: each --config, then each external target."""
    from streambandit.config.models import load_models_config
    from streambandit.replay.files import read_target_probs
    from streambandit.replay.runner import Target
    from streambandit.replay.states import read_model_states

    states = read_model_states(args.state) if args.state else None
    targets = []
    for value in args.config or []:
        name, path = _named(value, "--config")
        targets.append(Target(name, load_models_config(path), learn=not args.frozen, states=states))
    for value in args.external or []:
        name, sep, path = value.partition("=")
        probs = read_target_probs(path) if sep else None  # no file: the log's probs:NAME column
        targets.append(Target(name, probs=probs))
    names = [t.name for t in targets]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"targets named twice: {', '.join(dup)} (name them: --config NAME=PATH)")
    return targets


def _progress_printer(what: str, share=None, rows: int | None = None):
    """A progress callback printing events and rate to stderr, and the closing line to print
    when it printed anything. On a terminal a bar redrawn in place every second, otherwise a line
    every 5 s. The share done, for the bar and the time left, is of ``rows`` (a --rows range
    with an end) or else of the file (``share``, a ``files.ReadShare``); without either the
    line has no bar."""
    tty = sys.stderr.isatty()
    start = last = time.perf_counter()
    shown = False

    def fraction(n: int) -> float | None:
        if rows:
            return min(n / rows, 1.0)
        return share.fraction if share is not None else None

    def progress(n: int) -> None:
        nonlocal last, shown
        now = time.perf_counter()
        if now - last >= (1.0 if tty else 5.0):
            last, shown = now, True
            line = _progress_line(what, n, now - start, fraction(n))
            print(
                f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True
            )

    def done(n: int) -> None:
        if shown:
            elapsed = time.perf_counter() - start
            line = f"{what}: {n} events in {elapsed:.1f} s, {n / elapsed:.0f} events/s"
            # Spaces over the end of a longer bar line drawn in place.
            print(f"\r{line:<{_BAR_LINE}}" if tty else line, file=sys.stderr, flush=True)

    return progress, done


_BAR_WIDTH = 30
_BAR_LINE = 100  # characters a bar line can take


def _progress_line(what: str, n: int, elapsed: float, frac: float | None) -> str:
    rate = n / elapsed if elapsed > 0 else 0.0
    if frac is None:
        return f"{what}: {n} events, {rate:.0f} events/s"
    filled = int(frac * _BAR_WIDTH)
    bar = "#" * filled + "." * (_BAR_WIDTH - filled)
    left = f"{elapsed * (1.0 - frac) / frac:.0f} s left" if frac > 0 else "? s left"
    return f"{what}: [{bar}] {100 * frac:3.0f}% {n} events, {rate:.0f} events/s, {left}"


def _cmd_replay(args: argparse.Namespace) -> int:
    """Replay a decision log through the target policies: off-policy estimates and a report."""
    from streambandit.replay.figure_process import FigureProcess
    from streambandit.replay.report import to_markdown, write_report
    from streambandit.replay.runner import LEARNING_NOTE, replay_targets
    from streambandit.replay.states import write_model_states

    if args.clip is not None and not args.clip > 0:
        raise ValueError(f"--clip must be > 0, got {args.clip}")
    if args.reward_range and not args.reward_range[0] < args.reward_range[1]:
        raise ValueError(
            f"--reward-range needs LO < HI, got {args.reward_range[0]:g} {args.reward_range[1]:g}"
        )
    targets = _replay_targets(args)
    if not targets:
        raise ValueError(
            "nothing to evaluate: give a --config (the models) or an --external target"
        )
    _replicates(args)  # a bad --expected-value before the log is read
    learners = [t for t in targets if t.models is not None]
    if args.save_state and len(learners) != 1:
        raise ValueError(
            f"--save-state writes one target's models; there are {len(learners)} configured targets"
        )
    dims = {s.dim for t in learners for s in t.models.specs}
    counts: dict[str, int] = {}
    dim = dims.pop() if len(dims) == 1 else None
    decisions, source, share = _replay_source(args, counts, dim, configured=bool(learners))
    decisions = _rows(args.rows, decisions)
    # The figures are drawn by a child forked now: matplotlib loads on the other core while
    # this one replays (replay/figure_process.py).
    with FigureProcess() as figures:
        progress, done = _progress_printer("replay", share, _rows_wanted(args.rows))
        options = {
            "clip": args.clip,
            "skip_bad": args.skip_bad,
            "reward_range": tuple(args.reward_range) if args.reward_range else None,
        }
        results = replay_targets(
            decisions,
            targets,
            progress=progress,
            counts=counts,
            bootstrap=args.bootstrap,
            **options,
        )
        done(next(iter(results.values())).events)
        expected = _expected_values(args, targets, results, dim, options)
        if expected is None:
            for r in results.values():
                r.warnings[:] = [
                    f"{w} (--expected-value gives an interval for that)"
                    if w == LEARNING_NOTE
                    else w
                    for w in r.warnings
                ]
        config = ", ".join(args.config or [])
        written = write_report(
            results,
            args.out,
            source=source,
            config=config,
            clip=args.clip,
            expected=expected,
            figures=figures,
        )
        if args.save_state:
            n = write_model_states(args.save_state, results[learners[0].name].models)
            written.append(f"{args.save_state} ({n} models)")
        print(to_markdown(results, source=source, expected=expected), end="")
        print("wrote " + ", ".join(str(p) for p in written))
        return 0


def _replicates(args: argparse.Namespace) -> int:
    """The replicates ``--expected-value`` asks for (0: none)."""
    from streambandit.replay.paths import DEFAULT_REPLICATES

    if args.expected_value == 0:
        return 0
    replicates = DEFAULT_REPLICATES if args.expected_value is None else args.expected_value
    if replicates < 2:
        raise ValueError(f"--expected-value needs at least 2 replicates, got {replicates}")
    return replicates


def _expected_values(args, targets, results, dim, options):
    """``--expected-value R``: the learning targets' expected-value intervals (replay/paths.py),
    from R more replays of the log read afresh; None without the flag."""
    from streambandit.replay.paths import expected_values

    replicates = _replicates(args)
    if not replicates:
        return None
    if not any(t.kind == "learning" for t in targets):
        print(
            "--expected-value: no learning target (frozen and external targets have no learning "
            "path: their intervals already cover their value)",
            file=sys.stderr,
        )
        return None
    tty = sys.stderr.isatty()

    def progress(n: int, total: int) -> None:
        line = f"expected value: replicate {n} of {total} replayed"
        print(f"\r{line}" if tty else line, end="" if tty and n < total else "\n", file=sys.stderr)

    return expected_values(
        lambda: _rows(args.rows, _replay_source(args, {}, dim)[0]),
        targets,
        results,
        replicates=replicates,
        confidence=0.95,
        progress=progress,
        **options,
    )


def _cmd_tune(args: argparse.Namespace) -> int:
    """Replay a log through a grid of settings; rank them; write the recommended [[models]]."""
    import itertools
    import json
    from pathlib import Path

    from streambandit.config.models import dump_models_config, load_models_config
    from streambandit.replay import tune
    from streambandit.replay.report import plot_targets
    from streambandit.replay.runner import replay_targets

    base = load_models_config(args.config)
    cands = tune.candidates(base, tune.parse_grid(args.grid))
    dims = {s.dim for s in base.specs}
    dim = dims.pop() if len(dims) == 1 else None
    counts: dict[str, int] = {}
    decisions, source, share = _replay_source(args, counts, dim)
    decisions = _rows(args.rows, decisions)
    split = None
    if args.holdout is not None:
        # The log is read once more to count its rows: the held-out part is its last FRACTION.
        rows = sum(1 for _ in _rows(args.rows, _replay_source(args, {}, dim)[0]))
        split = tune.holdout_start(rows, args.holdout)
        decisions = itertools.islice(decisions, split)
    settings = {
        "clip": args.clip,
        "skip_bad": args.skip_bad,
        "bootstrap": args.bootstrap,
        "reward_range": tuple(args.reward_range) if args.reward_range else None,
    }
    progress, done = _progress_printer(
        f"tune ({len(cands)} candidates)",
        share,
        split if split is not None else _rows_wanted(args.rows),
    )
    results = replay_targets(
        decisions, tune.targets(cands), progress=progress, counts=counts, **settings
    )
    done(next(iter(results.values())).events)
    ranking = tune.rank(cands, results, args.estimator)
    held = None
    if split is not None:
        rest = itertools.islice(_rows(args.rows, _replay_source(args, {}, dim)[0]), split, None)
        target = tune.holdout_target(ranking.best, ranking.order[0][1])
        held = replay_targets(rest, [target], **settings)[target.name]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (c, r) in enumerate(ranking.order, start=1):
        e = r.estimate(args.estimator)
        rows.append(
            {
                "rank": i,
                "candidate": c.name,
                "settings": c.settings,
                "value": e.value,
                "ci_low": e.ci_low,
                "ci_high": e.ci_high,
                "ess": e.ess,
                "matched": r.matched,
            }
        )
    best, first = ranking.best, ranking.order[0][1]
    verdict = (
        f"best: {best.name} ({args.estimator} {first.estimate(args.estimator).value:.4f}), separated from every "
        "other candidate"
        if ranking.separated
        else f"the log cannot separate {best.name} from {', '.join(ranking.tied_with_best)}: their "
        f"{args.estimator} intervals overlap (a longer log, or a wider grid step, may)"
    )
    md = [
        f"Tuning on `{source}`: {first.events} events, {len(cands)} candidates, ranked by {args.estimator}.",
        "",
        f"| rank | candidate | {args.estimator} | 95% interval | ESS | matched |",
        "|---:|---|---:|---|---:|---:|",
    ]
    md += [
        f"| {r['rank']} | {r['candidate']} | {r['value']:.4f} | [{r['ci_low']:.4f}, {r['ci_high']:.4f}] | "
        f"{r['ess']:.1f} | {r['matched']} |"
        for r in rows
    ]
    md += [
        "",
        verdict,
        "",
        "Each candidate learned during the replay: its estimate is the value of its learning path "
        "through this log (docs/replay_formats.md).",
        "",
        tune.WINNERS_CURSE,
    ]
    holdout = None
    if held is not None:
        e = held.estimate(args.estimator)
        holdout = {
            "fraction": args.holdout,
            "ranked_rows": split,
            "events": held.events,
            "matched": held.matched,
            "value": e.value,
            "ci_low": e.ci_low,
            "ci_high": e.ci_high,
            "interval": e.interval,
            "ess": e.ess,
        }
        md += [
            "",
            f"Held out (--holdout {args.holdout:g}): ranked on the first {split} rows; on the "
            f"{held.events} rows after them {best.name}, continuing from the models it learned, has "
            f"{args.estimator} {e.value:.4f} [{e.ci_low:.4f}, {e.ci_high:.4f}] "
            f"(matched {held.matched}), an estimate the choice did not see.",
        ]
    (out / "tune.md").write_text("\n".join(md) + "\n")
    (out / "tune.json").write_text(
        json.dumps(
            {
                "source": source,
                "estimator": args.estimator,
                "events": first.events,
                "separated": ranking.separated,
                "best": best.name,
                "tied_with_best": ranking.tied_with_best,
                "candidates": rows,
                "holdout": holdout,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    header = [
        f"# streambandit tune {source}: the best of {len(cands)} candidates by {args.estimator}: {best.name}",
        f"# {verdict}",
        *([f"# {md[-1]}"] if held is not None else []),
        "# Replace the [[models]] tables of the worker's configuration with these.",
        "",
    ]
    (out / "recommended.toml").write_text("\n".join(header) + dump_models_config(best.models))
    written = [out / "tune.md", out / "tune.json", out / "recommended.toml"]
    if plot_targets([r for _, r in ranking.order], out / "tune.png"):
        written.append(out / "tune.png")
    print("\n".join(md))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


# `streambandit bench WHAT ...`: each benchmark parses its own options (`streambandit bench WHAT -h`).
_BENCHMARKS = {
    "peers": (
        "streambandit.benchmarks.inprocess",
        "learners in process against Vowpal Wabbit, MABWiser, River "
        "and a naive numpy OFUL: us per decide + update, regret, memory",
    ),
    # These are the checkout's own benchmarks (``python -m bench``): they write bench/results/ and
    # run only from a source checkout, whose bench package is not installed with streambandit.
    "e2e": (
        "bench.e2e",
        "the worker end to end on the embedded broker: the broker's ceiling, "
        "events/s, latency p50/p99/p99.9 at 10/50/90% of the maximum",
    ),
    "recovery": (
        "bench.recovery",
        "time to rebuild a partition after SIGKILL, snapshot bytes per model",
    ),
    "memory": ("bench.memory", "resident bytes per model with 100,000 live models"),
}


def _cmd_bench(args: argparse.Namespace) -> int:
    return _bench(list(args.rest))


def _bench(rest: list[str]) -> int:
    """Run a benchmark with its own options. ``main`` hands ``bench``'s arguments here before
    argparse sees them, because argparse would refuse the benchmark's options at the top level."""
    import importlib

    what = rest.pop(0) if rest and rest[0] in _BENCHMARKS else "peers"
    target = _BENCHMARKS[what][0]
    if target.startswith("bench."):
        checkout = Path(__file__).resolve().parents[2]
        if not (checkout / "bench" / "__init__.py").is_file():
            print(
                f"streambandit bench {what}: it runs from a source checkout of streambandit "
                f"(python -m {target}), and {checkout} is not one",
                file=sys.stderr,
            )
            return 2
        return subprocess.run(
            [sys.executable, "-m", target, *rest], cwd=checkout, check=False
        ).returncode
    module = importlib.import_module(target)
    return module.main(rest, command=" ".join(["streambandit bench", what, *rest]))


def _log_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``replay`` and ``tune`` that say how the log is read and estimated."""
    p.add_argument(
        "log",
        help="the log: .csv or .avro of logged decisions, DSJSON (.json, .dsjson, .gz), or an "
        "Open Bandit Dataset directory (docs/replay_formats.md)",
    )
    p.add_argument(
        "--format",
        choices=_LOG_FORMATS,
        default=None,
        help="the log's format (default: from its name)",
    )
    p.add_argument(
        "--catalog",
        default=None,
        help="CSV of arm features (arm_id, f0, f1, ...; non-numeric columns "
        "one-hot) for CSV logs without inline features",
    )
    p.add_argument(
        "--combine",
        choices=("outer", "concat"),
        default="outer",
        help="how a row's context (a CSV 'context' column, OBD's user features) and an arm's features "
        "make the arm's vector: outer = vec([1, u] c'), concat = [u, c] (default outer)",
    )
    p.add_argument(
        "--hash-dim",
        type=int,
        default=None,
        metavar="N",
        help="buckets for hashed features: a CSV context's name=value tokens; DSJSON's features "
        "(default: the models' dimension; 32 for DSJSON read by --external targets only)",
    )
    p.add_argument(
        "--user-dim",
        type=int,
        default=16,
        metavar="N",
        help="OBD: buckets for the hashed user features (default 16)",
    )
    p.add_argument(
        "--affinity", action="store_true", help="OBD: append each item's user-item affinity"
    )
    p.add_argument(
        "--model-key",
        default=None,
        help="OBD and DSJSON: the model key of their rows (default obd, dsjson)",
    )
    p.add_argument(
        "--clip", type=float, default=None, help="cap on the importance weights of ips, snips, dr"
    )
    p.add_argument(
        "--reward-range",
        type=float,
        nargs=2,
        metavar=("LO", "HI"),
        default=None,
        help="the rewards' bounds: a reward outside is an error, every value and bound is kept "
        "inside, and rewards at LO and HI only get score intervals (default: the log's least and "
        "largest reward)",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="B",
        help="percentile intervals from B Poisson bootstrap replicates instead (e.g. 200; 0: off)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip bad rows (counted in the report) instead of failing",
    )
    p.add_argument(
        "--rows",
        default=None,
        metavar="START:STOP",
        help="use only the log's decisions START..STOP-1 (0-based, either end may be left out), e.g. "
        ":5000 to train and 5000: to evaluate on the rest",
    )


def _rows(spec: str | None, decisions):
    """``decisions`` cut to ``--rows START:STOP``."""
    import itertools

    if spec is None:
        return decisions
    return itertools.islice(decisions, *_rows_range(spec))


def _rows_wanted(spec: str | None) -> int | None:
    """How many rows ``--rows START:STOP`` asks for; None without an end (or a range)."""
    if spec is None:
        return None
    a, b = _rows_range(spec)
    return None if b is None else b - a


def _rows_range(spec: str) -> tuple[int, int | None]:
    start, sep, stop = spec.partition(":")
    try:
        a, b = int(start) if start.strip() else 0, int(stop) if stop.strip() else None
    except ValueError:
        raise ValueError(f"--rows {spec!r}: expected START:STOP with integers") from None
    if not sep or a < 0 or (b is not None and b < a):
        raise ValueError(f"--rows {spec!r}: expected START:STOP with 0 <= START <= STOP")
    return a, b


def _log_format_option(command: argparse.ArgumentParser) -> None:
    """``--log-format`` of a command that has no log of its own to configure: under json its
    warnings, librdkafka's lines and its final error are JSON objects on stderr (main)."""
    command.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="lines on stderr (warnings, errors) as text (default) or JSON objects, one per line",
    )


def build_parser() -> argparse.ArgumentParser:
    from streambandit import __version__
    from streambandit.serving import auth

    parser = argparse.ArgumentParser(
        prog="streambandit", description="Streaming contextual bandits on Kafka."
    )
    parser.add_argument("--version", action="version", version=f"streambandit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser(
        "simulate-ads", help="in-process ad simulation with live click-through figures"
    )
    sim.add_argument("--policy", default="glb_omd", help="policy name (default glb_omd)")
    sim.add_argument("--dim", type=int, default=20, help="feature dimension of an ad (default 20)")
    sim.add_argument("--arms", type=int, default=10, help="candidate ads per request (default 10)")
    sim.add_argument(
        "--requests", type=int, default=20_000, help="requests to simulate (default 20,000)"
    )
    sim.add_argument("--duration", type=float, default=60.0, help="seconds at most")
    sim.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the simulated traffic and of the learner (default 0)",
    )
    sim.add_argument(
        "--beta-scale",
        type=float,
        default=None,
        help="multiplier on the policy's confidence radius (glb_omd default here: 0.1; 1 = theory)",
    )
    sim.set_defaults(func=_cmd_simulate_ads)
    serve = sub.add_parser("serve", help="run a worker in a consumer group")
    serve.add_argument(
        "--config", required=True, help="TOML file: [kafka], [worker], [topics], [[models]]"
    )
    serve.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("STREAMBANDIT_BOOTSTRAP_SERVERS"),
        help="overrides [kafka] bootstrap.servers (env STREAMBANDIT_BOOTSTRAP_SERVERS)",
    )
    where = serve.add_mutually_exclusive_group()
    where.add_argument(
        "--snapshot-topic",
        default=None,
        help="keep snapshots in this compacted topic (overrides [worker] snapshot_topic/snapshot_dir)",
    )
    where.add_argument(
        "--snapshot-dir",
        default=None,
        help="keep snapshots in this directory (overrides [worker] snapshot_topic/snapshot_dir)",
    )
    serve.add_argument(
        "--instance-id",
        default=None,
        help="this worker's id, unique among the group's live workers and kept across its restarts "
        "(default: the host name; start several workers on one host with an id each)",
    )
    serve.add_argument(
        "--processes",
        type=int,
        default=None,
        help="workers to run, each a process of its own with the instance id <instance id>-<i>, "
        "restarted when one fails (default: the CPUs this process may use; 1 runs the worker "
        "in this process)",
    )
    serve.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /healthz and /ready on this port (overrides [worker] metrics_port; with "
        "--processes N, child i uses this port + i)",
    )
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines on stderr as text (default) or JSON objects, one per line (containers)",
    )
    serve.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration (the file under the STREAMBANDIT_<TABLE>__<KEY> "
        "environment: every setting's type and range, settings that must agree, models, "
        "librdkafka settings) and exit; no broker is contacted",
    )
    serve.add_argument(
        "--print-config",
        action="store_true",
        help="validate as --check-config, then print the configuration in effect (defaults, "
        "environment and command line applied) as TOML, credentials masked, and exit",
    )
    serve.add_argument(
        "-v", "--verbose", action="store_true", help="DEBUG log lines (the default is INFO)"
    )
    serve.set_defaults(func=_cmd_serve)

    demo = sub.add_parser(
        "demo", help="the main job: embedded broker, simulated ad server and a worker, live figures"
    )
    demo.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds to run (default 60; Ctrl-C stops earlier)",
    )
    demo.add_argument(
        "--rate", type=float, default=500.0, help="ad requests per second offered (default 500)"
    )
    demo.add_argument("--policy", default="glb_omd", help="learner (default glb_omd)")
    demo.add_argument("--dim", type=int, default=20, help="feature dimension of an ad (default 20)")
    demo.add_argument("--arms", type=int, default=10, help="candidate ads per request (default 10)")
    demo.add_argument("--partitions", type=int, default=2, help="partitions per topic (default 2)")
    demo.add_argument(
        "--seed", type=int, default=0, help="seed of the simulated ad server (default 0)"
    )
    demo.add_argument(
        "--out", default="out/demo", help="where demo.csv and demo.png go (default out/demo)"
    )
    demo.add_argument(
        "--edge",
        action="store_true",
        help="decide at the edge: the ad server ranks with a replica of the models in its own process "
        "and a learn-only worker learns; shows the edge's decision time beside the Kafka round trip",
    )
    demo.add_argument(
        "--kafka",
        action="store_true",
        help="run on Apache Kafka (as streambandit broker --kafka: needs Java 17+, and Maven the first "
        "time) instead of the embedded broker",
    )
    demo.set_defaults(func=_cmd_demo)

    exp = sub.add_parser(
        "export",
        help="write a worker group's joined decisions (with their contexts) to an Avro file",
    )
    exp.add_argument(
        "--config", required=True, help="the worker's TOML file (Kafka connection, group, topics)"
    )
    exp.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("STREAMBANDIT_BOOTSTRAP_SERVERS"),
        help="overrides [kafka] bootstrap.servers (env STREAMBANDIT_BOOTSTRAP_SERVERS)",
    )
    exp.add_argument("--partitions", default=None, help="comma-separated partitions (default: all)")
    exp.add_argument(
        "--from-ms", type=int, default=None, help="keep decisions with event time >= this (ms)"
    )
    exp.add_argument(
        "--to-ms", type=int, default=None, help="keep decisions with event time < this (ms)"
    )
    exp.add_argument(
        "--out", required=True, help="the Avro file to write (read it with `streambandit replay`)"
    )
    _log_format_option(exp)
    exp.set_defaults(func=_cmd_export)

    simp = sub.add_parser(
        "simulate",
        help="a paper's experiment in the simulator: regret and time, CSV + PNG + summary",
    )
    simp.add_argument(
        "experiment", help="glb-omd-logistic, glb-omd-poisson, hvt-ucb, dbs-linucb, bkb, or all"
    )
    sizes = simp.add_mutually_exclusive_group()
    sizes.add_argument("--full", action="store_true", help="the paper's sizes (long)")
    sizes.add_argument("--tiny", action="store_true", help="seconds-long smoke run")
    simp.add_argument(
        "--seeds", type=int, default=None, help="number of seeds (default: the experiment's)"
    )
    simp.add_argument(
        "--out", default="out/simulate", help="where NAME.csv, NAME.png and NAME.md go"
    )
    simp.set_defaults(func=_cmd_simulate)

    top = sub.add_parser(
        "topics",
        help="create or describe the topics a worker configuration names",
        description="create: every topic of [topics] with --partitions each, and [worker] "
        "snapshot_topic compacted, with the settings deploy/README.md names (LogAppendTime "
        "inputs, a joined log kept for ever, min.insync.replicas 2 with 3 replicas or more); "
        "existing ones are left as they are, and any partition count or setting of theirs that "
        "differs is reported (exit 1 when a partition count does); with --dry-run it says "
        "what it would create and changes nothing. describe: partition "
        "counts and whether the topics are co-partitioned (exit 1 if not).",
    )
    top.add_argument("action", choices=("create", "describe"), help="create or describe")
    top.add_argument("--config", required=True, help="the worker's TOML file")
    top.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("STREAMBANDIT_BOOTSTRAP_SERVERS"),
        help="overrides [kafka] bootstrap.servers (default: $STREAMBANDIT_BOOTSTRAP_SERVERS)",
    )
    top.add_argument(
        "--partitions", type=int, default=8, help="partitions of each topic created (default 8)"
    )
    top.add_argument(
        "--replication",
        type=int,
        default=None,
        help="replication factor of the topics created (default: 3, or the number of brokers "
        "when fewer; -1: the cluster's default.replication.factor)",
    )
    top.add_argument(
        "--dry-run",
        action="store_true",
        help="with create: say what would be created, and how existing topics differ; "
        "create and change nothing",
    )
    _log_format_option(top)
    top.set_defaults(func=_cmd_topics)

    st = sub.add_parser(
        "status",
        help="where a worker group stands: each input partition's owner, committed and end "
        "offsets, lag, and its newest snapshot",
        description="For each input partition of the configuration's group: the member that "
        "holds it (the worker's instance id as client id, and its host), the committed and end "
        "offsets and the lag between them, and the newest snapshot in the snapshot store (its "
        "position in that input, its age and its models). Reads only: the group is not joined.",
    )
    st.add_argument("--config", required=True, help="the worker's TOML file")
    st.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("STREAMBANDIT_BOOTSTRAP_SERVERS"),
        help="overrides [kafka] bootstrap.servers (default: $STREAMBANDIT_BOOTSTRAP_SERVERS)",
    )
    st_where = st.add_mutually_exclusive_group()
    st_where.add_argument(
        "--snapshot-topic", default=None, help="read the snapshots from this topic instead"
    )
    st_where.add_argument(
        "--snapshot-dir", default=None, help="read the snapshots from this directory instead"
    )
    st.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    _log_format_option(st)
    st.set_defaults(func=_cmd_status)

    api = sub.add_parser(
        "api", help="rank and reward over HTTP (Personalizer-shaped JSON), decided in process"
    )
    api.add_argument(
        "--models",
        default=None,
        help="the TOML file with the [[models]] tables (as serve's): decide "
        "and learn in this process",
    )
    api.add_argument(
        "--replica-of",
        default=None,
        metavar="CONFIG",
        help="a learn-only worker group's TOML file: decide with a replica of its models, followed from "
        "its snapshots and joined log; decisions and rewards go to its decisions and rewards topics",
    )
    api.add_argument(
        "--snapshot-topic",
        default=None,
        help="with --replica-of: the learners' snapshot topic, if not the file's",
    )
    api.add_argument(
        "--snapshot-dir",
        default=None,
        help="with --replica-of: the learners' snapshot directory, if not the file's",
    )
    api.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("STREAMBANDIT_BOOTSTRAP_SERVERS"),
        help="with --replica-of: the brokers, if not the file's",
    )
    api.add_argument(
        "--max-staleness",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --replica-of: refuse to rank (503 stale_replica, /ready 503) while the replica may be "
        "more than this far behind the learners' log (default: no bound)",
    )
    api.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)"
    )
    api.add_argument("--port", type=int, default=8080, help="the port (default 8080)")
    api.add_argument(
        "--model-key", default=None, help="the model of a request that names none (modelKey)"
    )
    api.add_argument(
        "--snapshot", default=None, help="a file to load the state from at start and save it to"
    )
    api.add_argument(
        "--save-every",
        type=float,
        default=30.0,
        help="seconds between saves of --snapshot (default 30)",
    )
    api.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines on stderr as text (default) or JSON objects, one per line (containers)",
    )
    api.add_argument(
        "--max-models",
        type=int,
        default=None,
        help="the most model keys served; a request for one more is refused (default 10,000 with "
        "--models; with --replica-of none: the learners' [worker] max_models bounds their models)",
    )
    api.add_argument(
        "--api-keys",
        default=None,
        metavar="FILE",
        help="the API keys, one a line: NAME SCOPES SECRET (default: $STREAMBANDIT_API_KEYS_FILE, "
        "or the lines in $STREAMBANDIT_API_KEYS; docs/security.md)",
    )
    api.add_argument(
        "--open-paths",
        default=None,
        metavar="PATHS",
        help="with keys: the paths served without a key, of healthz, ready, metrics "
        "(default healthz,ready; '' for none)",
    )
    api.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        metavar="RPS",
        help="with keys: the requests a second each key may make, sustained; over it, 429 "
        f"(default {auth.DEFAULT_RATE_PER_S:g}; 0: no limit)",
    )
    api.add_argument(
        "--burst",
        type=int,
        default=None,
        metavar="N",
        help=f"with keys: the most requests a key may make at once, its bucket's size (default "
        f"{auth.DEFAULT_BURST})",
    )
    api.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="serve HTTPS: the PEM certificate chain"
    )
    api.add_argument(
        "--tls-key",
        default=None,
        metavar="FILE",
        help="serve HTTPS: the certificate's PEM private key",
    )
    api.add_argument(
        "--insecure",
        action="store_true",
        help="serve without API keys on an address other than loopback (refused otherwise)",
    )
    api.set_defaults(func=_cmd_api)

    brk = sub.add_parser(
        "broker",
        help="run a development broker in the foreground: the embedded one (Tansu), or "
        "Apache Kafka with --kafka",
    )
    brk.add_argument(
        "--port",
        type=int,
        default=9092,
        help="the port to listen on, on 127.0.0.1 (default 9092; with "
        "--kafka --nodes N, node i listens on port + i - 1)",
    )
    brk.add_argument(
        "--kafka",
        action="store_true",
        help="run Apache Kafka (KRaft, the version of streambandit/dev/kafka-jars.lock) instead of the "
        "embedded broker; needs Java 17+, and Maven the first time to fetch its jars into "
        "~/.cache/streambandit/kafka (env STREAMBANDIT_KAFKA_CACHE)",
    )
    brk.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="with --kafka: this many combined broker+controller nodes (default 1; 3 is a cluster with "
        "replication factor 3 and min.insync.replicas 2)",
    )
    brk.add_argument(
        "--data-dir",
        default=None,
        help="with --kafka: keep the nodes' logs and topics here across runs (default: a temporary "
        "directory, removed at the stop)",
    )
    brk.add_argument(
        "--create-topics",
        action="store_true",
        help="create the topics of --config (or the default names, and the snapshot topic "
        "streambandit-snapshots) and print the client settings this broker needs",
    )
    brk.add_argument(
        "--config",
        default=None,
        help="with --create-topics: the worker's TOML file naming the topics",
    )
    brk.add_argument(
        "--partitions",
        type=int,
        default=2,
        help="with --create-topics: partitions per topic (default 2)",
    )
    brk.set_defaults(func=_cmd_broker)

    rep = sub.add_parser(
        "replay", help="replay a decision log through target policies: off-policy estimates"
    )
    _log_arguments(rep)
    rep.add_argument(
        "--config",
        action="append",
        metavar="[NAME=]TOML",
        help="a target: a worker's TOML file whose [[models]] are the policies (repeat for several "
        "targets, evaluated in one pass; named by the file's stem unless NAME= says)",
    )
    rep.add_argument(
        "--external",
        action="append",
        metavar="NAME[=FILE]",
        help="a target from another system, given by its probabilities for each row: a side file "
        "'event_id,probs' (FILE), or without =FILE the log's 'probs:NAME' column",
    )
    rep.add_argument(
        "--frozen", action="store_true", help="the --config targets do not learn from the log"
    )
    rep.add_argument(
        "--state",
        default=None,
        metavar="FILE",
        help="the --config targets' models start from these states: a file of --save-state, or a "
        "worker's base snapshot file (p<N>.snap)",
    )
    rep.add_argument(
        "--save-state",
        default=None,
        metavar="FILE",
        help="write the (one) --config target's models after the replay, for --state",
    )
    rep.add_argument(
        "--expected-value",
        type=int,
        nargs="?",
        const=None,  # paths.DEFAULT_REPLICATES, imported when used (the CLI starts without numpy)
        default=0,
        metavar="R",
        help="also an interval for each learning target's expected value (over learning paths: "
        "what a deployment can expect) from R more replays of the log (default 10): R + 1 times "
        "the replay's cost",
    )
    rep.add_argument(
        "--out",
        default="out/replay",
        help="where replay.md, replay.json, replay.png go (default out/replay)",
    )
    rep.set_defaults(func=_cmd_replay)

    tun = sub.add_parser(
        "tune", help="replay a log through a grid of settings and recommend the best [[models]]"
    )
    _log_arguments(tun)
    tun.add_argument(
        "--config",
        required=True,
        help="the worker's TOML file: its [[models]] are the base the grid changes",
    )
    tun.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="NAME=V1,V2,...",
        help="a setting and its values: a hyper-parameter (lam, beta_scale, link, ...) or policy, "
        "epsilon; repeat for more (every combination is a candidate, at most 64)",
    )
    tun.add_argument(
        "--estimator",
        choices=("snips", "dr", "ips"),
        default="snips",
        help="the estimate candidates are ranked by (default snips)",
    )
    tun.add_argument(
        "--holdout",
        type=float,
        default=None,
        metavar="FRACTION",
        help="rank on the log's first rows and replay the best on its last FRACTION (e.g. 0.3), "
        "continuing from what it learned: an estimate of the chosen candidate the choice did not "
        "see (the best of several estimates is biased upward); reads the log twice more",
    )
    tun.add_argument(
        "--out",
        default="out/tune",
        help="where tune.md, tune.json, recommended.toml, tune.png go (default out/tune)",
    )
    tun.set_defaults(func=_cmd_tune)

    ben = sub.add_parser(
        "bench",
        help="throughput, latency and memory figures (`streambandit bench WHAT -h`)",
        description="Benchmarks; results are printed as markdown. "
        + " ".join(f"{k}: {v}." for k, (_, v) in _BENCHMARKS.items()),
    )
    ben.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="[WHAT] ...",
        help=f"which benchmark ({', '.join(_BENCHMARKS)}; default peers), then its own options",
    )
    ben.set_defaults(func=_cmd_bench)
    for choice in sub._choices_actions:  # each subcommand's --help opens with what it does
        command = sub.choices[choice.dest]
        command.description = command.description or f"{choice.help[0].upper()}{choice.help[1:]}."
    return parser


def main(argv: list[str] | None = None) -> int:
    from streambandit.errors import StreambanditError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and argv[1:2] not in (["-h"], ["--help"]):
        return _bench(argv[1:])
    from streambandit.log_format import error_line

    args = build_parser().parse_args(argv)
    if getattr(args, "log_format", "text") == "json":  # serve and api set their level later
        import logging

        from streambandit.log_format import configure_logging

        configure_logging(logging.WARNING, "json")
    else:  # a command that sets up no logging still masks credentials in a traceback
        from streambandit.log_format import redact_uncaught

        redact_uncaught()
    from streambandit.stream.errors import NOT_AUTHORIZED_EXIT, NotAuthorized

    try:
        return args.func(args)
    except ValueError as exc:  # bad configuration or arguments
        error_line(str(exc))
        return 2
    except NotAuthorized as exc:  # a missing ACL or refused credentials (docs/security.md)
        error_line(str(exc))
        return NOT_AUTHORIZED_EXIT
    except (
        StreambanditError
    ) as exc:  # a state the process cannot continue from (its message says why)
        error_line(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
