#!/usr/bin/env bash
# A single-node Apache Kafka (KRaft, combined broker+controller) for development and tests.
#
#   scripts/kafka.sh fetch    download Kafka and its runtime deps with Maven into the cache
#   scripts/kafka.sh up       fetch if needed, format storage once, start, wait until ready
#   scripts/kafka.sh down     stop the broker started by `up`
#   scripts/kafka.sh status   exit 0 when the broker answers
#   scripts/kafka.sh reset    stop and delete the broker's data (next `up` formats again)
#
# Everything lives outside the repository: jars in $GPULEDGER_KAFKA_CACHE
# (~/.cache/gpuledger/kafka-<version>), data, config and logs in $GPULEDGER_KAFKA_HOME
# (/tmp/gpuledger-kafka). Every command is idempotent.
set -euo pipefail

VERSION=${KAFKA_VERSION:-4.1.1}
LOG4J_VERSION=${LOG4J_VERSION:-2.25.3}
SLF4J_VERSION=${SLF4J_VERSION:-2.0.17}
CACHE=${GPULEDGER_KAFKA_CACHE:-$HOME/.cache/gpuledger/kafka-$VERSION}
HOME_DIR=${GPULEDGER_KAFKA_HOME:-/tmp/gpuledger-kafka}
PORT=${GPULEDGER_KAFKA_PORT:-19092}
CONTROLLER_PORT=${GPULEDGER_KAFKA_CONTROLLER_PORT:-19093}
HEAP=${GPULEDGER_KAFKA_HEAP:-768m}
READY_TIMEOUT_S=${GPULEDGER_KAFKA_READY_TIMEOUT:-120}
# A fixed cluster id: the data directory is ours alone, and a fixed id makes `format`
# reproducible (any base64 UUID of 16 bytes will do).
CLUSTER_ID=gpuledgerKRaft00000000A
PIDFILE=$HOME_DIR/kafka.pid
LOG=$HOME_DIR/kafka.log

log() { echo "kafka.sh: $*" >&2; }

fetch() {
  # The stamp names the dependency set, so changing a version refetches.
  local stamp="$CACHE/.complete-$LOG4J_VERSION-$SLF4J_VERSION"
  if [[ -f $stamp ]]; then
    return 0
  fi
  mkdir -p "$CACHE"
  log "fetching org.apache.kafka:kafka_2.13:$VERSION and its runtime dependencies into $CACHE"
  # Kafka logs through SLF4J and ships log4j2 as its backend, but its pom declares no
  # backend and resolves slf4j-api 1.7; we add log4j-core, the SLF4J 2 binding and
  # slf4j-api 2 (nearest wins in Maven) so the broker's log reaches server.log.
  cat >"$CACHE/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>gpuledger</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>$VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>$LOG4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>$LOG4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>$SLF4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
POM
  rm -rf "$CACHE/libs.tmp"
  mvn -B -q -f "$CACHE/pom.xml" \
    -Dmaven.repo.local="${GPULEDGER_M2:-$HOME/.cache/gpuledger/m2}" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$CACHE/libs.tmp" \
    >"$CACHE/fetch.log" 2>&1 || { cat "$CACHE/fetch.log" >&2; log "fetch failed"; exit 1; }
  rm -rf "$CACHE/libs"
  mv "$CACHE/libs.tmp" "$CACHE/libs"
  rm -f "$CACHE"/.complete*
  touch "$stamp"
  log "fetched $(find "$CACHE/libs" -name '*.jar' | wc -l) jars"
}

write_config() {
  mkdir -p "$HOME_DIR/data"
  # Settings for one machine and fast tests: replication factor 1 everywhere, no initial
  # rebalance delay, short minimum session timeouts so a dead consumer is noticed in
  # seconds, and quick cleanup of transactions a killed producer left open.
  cat >"$HOME_DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$HOME_DIR/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=500
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
transaction.remove.expired.transaction.cleanup.interval.ms=60000
log.segment.bytes=67108864
log.cleaner.min.compaction.lag.ms=0
PROPS
  cat >"$HOME_DIR/log4j2.properties" <<'L4J'
rootLogger.level=WARN
rootLogger.appenderRef.file.ref=FILE
appender.file.type=File
appender.file.name=FILE
appender.file.fileName=${sys:kafka.logs.dir}/server.log
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
logger.kafka.name=kafka.server.KafkaRaftServer
logger.kafka.level=INFO
L4J
}

java_cmd() {
  java "-Xmx$HEAP" "-Xms$HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$HOME_DIR/log4j2.properties" \
    "-Dkafka.logs.dir=$HOME_DIR" -cp "$CACHE/libs/*" "$@"
}

running() {
  [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

ready() {
  # The port opens before the broker has caught up with the controller; the log line is
  # written once it serves requests.
  port_open && grep -q "Kafka Server started" "$HOME_DIR/server.log" 2>/dev/null
}

up() {
  fetch
  if running && ready; then
    log "already running on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
    return 0
  fi
  if ! running && port_open; then
    log "port $PORT is taken by a process this script did not start"
    exit 1
  fi
  write_config
  if [[ ! -f $HOME_DIR/data/meta.properties ]]; then
    java_cmd kafka.tools.StorageTool format -t "$CLUSTER_ID" \
      -c "$HOME_DIR/server.properties" --ignore-formatted >"$HOME_DIR/format.log" 2>&1 \
      || { cat "$HOME_DIR/format.log" >&2; exit 1; }
  fi
  if ! running; then
    : >"$HOME_DIR/server.log"
    # setsid: the broker outlives the make/pytest process that started it.
    setsid nohup bash -c "$(declare -f java_cmd); HEAP=$HEAP HOME_DIR=$HOME_DIR CACHE=$CACHE \
      java_cmd kafka.Kafka '$HOME_DIR/server.properties'" >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    log "starting (pid $(cat "$PIDFILE")), logs in $HOME_DIR"
  fi
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until ready; do
    if ! running; then
      tail -50 "$LOG" "$HOME_DIR/server.log" >&2 || true
      log "broker exited during start-up"
      exit 1
    fi
    if ((SECONDS > deadline)); then
      log "not ready after ${READY_TIMEOUT_S}s"
      exit 1
    fi
    sleep 0.5
  done
  log "ready on 127.0.0.1:$PORT"
}

down() {
  if ! running; then
    rm -f "$PIDFILE"
    log "not running"
    return 0
  fi
  local pid
  pid=$(cat "$PIDFILE")
  # The pid is the setsid'd bash, leader of its own process group: signal the group so
  # the JVM goes with it.
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
  log "stopped"
}

case ${1:-} in
  fetch) fetch ;;
  up) up ;;
  down) down ;;
  status) running && ready ;;
  reset) down; rm -rf "$HOME_DIR" ;;
  bootstrap) echo "127.0.0.1:$PORT" ;;
  *) echo "usage: $0 fetch|up|down|status|reset|bootstrap" >&2; exit 2 ;;
esac
