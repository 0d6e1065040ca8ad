#!/usr/bin/env bash
# Creates streambandit's topics on an Apache Kafka cluster (idempotent).
#   BOOTSTRAP=kafka:9092 PARTITIONS=8 REPLICATION=3 ./create-topics.sh
# All topics get the same partition count (co-partitioning: a model's contexts, rewards, outputs
# and snapshots share a partition number). Partitions are the unit of scale-out: at most one
# worker per partition does work, so create as many as the most workers you will run.
set -euo pipefail
BOOTSTRAP=${BOOTSTRAP:-localhost:9092}
PARTITIONS=${PARTITIONS:-8}
REPLICATION=${REPLICATION:-1}
KAFKA_TOPICS=${KAFKA_TOPICS:-$(command -v kafka-topics.sh || echo /opt/kafka/bin/kafka-topics.sh)}

create() {
  "$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$1" \
    --partitions "$PARTITIONS" --replication-factor "$REPLICATION" "${@:2}"
}

create contexts
create rewards
# Recovery re-reads actions and joined records written since a partition's last snapshot, so
# keep them far longer than snapshot_interval_s (the default 7 days is plenty). joined is also
# the learning log that replay and off-policy evaluation read: keep it as long as you want to replay.
create actions
create joined
create dead-letter
# Snapshots: compacted, so only the latest records of each key (two slots per partition) remain.
create streambandit-snapshots --config cleanup.policy=compact --config min.cleanable.dirty.ratio=0.1 \
  --config segment.ms=600000
echo "topics ready on $BOOTSTRAP ($PARTITIONS partitions each)"
