"""The ``streambandit`` command line. The only module that reads the environment or prints."""

from __future__ import annotations

import argparse
import os
import sys
import time

# Bit-exact replay needs the same floating-point reduction order every run; a multi-threaded BLAS
# may split a product differently from run to run. Set before numpy is imported anywhere.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def _cmd_simulate_ads(args: argparse.Namespace) -> int:
    """In-process ad simulation: the learner against the best and random choice, live figures."""
    import numpy as np

    from streambandit import make_policy
    from streambandit.sim.ads import AdTraffic

    traffic = AdTraffic(dim=args.dim, k=args.arms, seed=args.seed)
    # ||theta*|| of the simulated click model is 7.8 (a 3% base rate is a logit of -3.5), so S = 8.
    # The theory radius (beta ~ 200 here) explores for far longer than a demo runs; 0.1 of it
    # learns within seconds. Measured on 20k requests: theory radius 0.034 expected CTR (random
    # 0.037), beta_scale 0.1 gives 0.074, best possible 0.083.
    hyper: dict = {"link": "logistic", "S": 8.0, "beta_scale": 0.1} if args.policy == "glb_omd" else {}
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
            clicks += float(req.click_rates[i])  # expected CTR of the choice: less noisy than clicks
            best += float(req.click_rates.max())
            rand += float(req.click_rates.mean())
            n += 1
            now = time.perf_counter()
            if now - last >= 1.0 or n == args.requests:
                print(f"{n:>9} {n / (now - start):>8.0f} {clicks / n:>12.4f} {best / n:>9.4f} {rand / n:>11.4f}", flush=True)
                last = now
    except KeyboardInterrupt:
        print("stopped")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    """A worker in a consumer group, until SIGTERM/SIGINT (then it snapshots and leaves cleanly)."""
    import logging
    import signal

    from streambandit.stream.app_config import load_worker_config
    from streambandit.stream.snapshots import DirectoryStore, SnapshotStore, SnapshotStoreError, TopicStore
    from streambandit.stream.worker import Worker

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config, snaps = load_worker_config(args.config, bootstrap_servers=args.bootstrap_servers)
    # A command-line choice replaces the file's, whichever kind of store either names.
    topic = args.snapshot_topic or (None if args.snapshot_dir else snaps.topic)
    directory = args.snapshot_dir or (None if args.snapshot_topic else snaps.dir)
    store: SnapshotStore
    if topic:
        try:
            store = TopicStore(config.bootstrap_servers, topic, kafka=config.kafka, max_chunk_bytes=snaps.max_chunk_bytes)
        except SnapshotStoreError as exc:
            raise ValueError(str(exc)) from None
    elif directory:
        store = DirectoryStore(directory)
    else:
        raise ValueError("no snapshot store: set [worker] snapshot_topic (a compacted topic) or snapshot_dir, "
                         "or pass --snapshot-topic or --snapshot-dir")
    try:
        worker = Worker(config, store, instance_id=args.instance_id)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        worker.run(max_seconds=args.duration)
    finally:
        if isinstance(store, TopicStore):
            store.close()
    print(" ".join(f"{k}={v}" for k, v in sorted(worker.metrics.items())), flush=True)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """The whole loop on the embedded broker: a simulated ad server and a worker, live figures."""
    from pathlib import Path

    from streambandit.stream.demo import DemoConfig, run_demo

    run_demo(DemoConfig(duration_s=args.duration, rate_per_s=args.rate, policy=args.policy, dim=args.dim,
                        arms=args.arms, partitions=args.partitions, seed=args.seed, out_dir=Path(args.out)))
    return 0


def _cmd_broker(args: argparse.Namespace) -> int:
    """The embedded development broker in the foreground."""
    from streambandit.stream.broker import EmbeddedBroker

    b = EmbeddedBroker(port=args.port)
    b.start()
    print(f"embedded broker listening: bootstrap.servers={b.bootstrap_servers} (log: {b.log_path}); Ctrl-C stops it", flush=True)
    return b.wait()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streambandit", description="Streaming contextual bandits on Kafka.")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate-ads", help="in-process ad simulation with live click-through figures")
    sim.add_argument("--policy", default="glb_omd", help="policy name (default glb_omd)")
    sim.add_argument("--dim", type=int, default=20)
    sim.add_argument("--arms", type=int, default=10)
    sim.add_argument("--requests", type=int, default=20_000)
    sim.add_argument("--duration", type=float, default=60.0, help="seconds at most")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--beta-scale", type=float, default=None,
                     help="multiplier on the policy's confidence radius (glb_omd default here: 0.1; 1 = theory)")
    sim.set_defaults(func=_cmd_simulate_ads)
    serve = sub.add_parser("serve", help="run a worker in a consumer group")
    serve.add_argument("--config", required=True, help="TOML file: [kafka], [worker], [topics], [[models]]")
    serve.add_argument("--bootstrap-servers", default=os.environ.get("STREAMBANDIT_BOOTSTRAP_SERVERS"),
                       help="overrides [kafka] bootstrap.servers (env STREAMBANDIT_BOOTSTRAP_SERVERS)")
    where = serve.add_mutually_exclusive_group()
    where.add_argument("--snapshot-topic", default=None,
                       help="keep snapshots in this compacted topic (overrides [worker] snapshot_topic/snapshot_dir)")
    where.add_argument("--snapshot-dir", default=None,
                       help="keep snapshots in this directory (overrides [worker] snapshot_topic/snapshot_dir)")
    serve.add_argument("--instance-id", default=None, help="this worker's id (default: random)")
    serve.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    serve.add_argument("-v", "--verbose", action="store_true")
    serve.set_defaults(func=_cmd_serve)

    demo = sub.add_parser("demo", help="the main job: embedded broker, simulated ad server and a worker, live figures")
    demo.add_argument("--duration", type=float, default=60.0, help="seconds to run (default 60; Ctrl-C stops earlier)")
    demo.add_argument("--rate", type=float, default=500.0, help="ad requests per second offered (default 500)")
    demo.add_argument("--policy", default="glb_omd", help="learner (default glb_omd)")
    demo.add_argument("--dim", type=int, default=20, help="feature dimension of an ad (default 20)")
    demo.add_argument("--arms", type=int, default=10, help="candidate ads per request (default 10)")
    demo.add_argument("--partitions", type=int, default=2, help="partitions per topic (default 2)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="out/demo", help="where demo.csv and demo.png go (default out/demo)")
    demo.set_defaults(func=_cmd_demo)

    brk = sub.add_parser("broker", help="run the embedded development broker (Tansu) in the foreground")
    brk.add_argument("--port", type=int, default=9092)
    brk.set_defaults(func=_cmd_broker)
    return parser


def main(argv: list[str] | None = None) -> int:
    from streambandit.errors import StreambanditError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # bad configuration or arguments
        print(f"streambandit: error: {exc}", file=sys.stderr)
        return 2
    except StreambanditError as exc:  # a state the process cannot continue from (its message says why)
        print(f"streambandit: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
