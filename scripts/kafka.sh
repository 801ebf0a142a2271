#!/usr/bin/env bash
# A single-node Apache Kafka (KRaft, combined broker+controller) for development and tests.
#
#   scripts/kafka.sh fetch    download Kafka and its runtime deps with Maven into the cache
#   scripts/kafka.sh up       fetch if needed, format storage once, start, wait until ready
#   scripts/kafka.sh down     stop the broker started by `up`
#   scripts/kafka.sh status   exit 0 when the broker answers
#   scripts/kafka.sh reset    stop and delete the broker's data (next `up` formats again)
#   scripts/kafka.sh bootstrap [plaintext|sasl_plaintext|sasl_ssl|ssl]
#                             print the address of a listener (default plaintext)
#   scripts/kafka.sh listeners print every listener, the test SASL user and the CA file
#
# Listeners, all on 127.0.0.1 (ports override with GPULEDGER_KAFKA_*_PORT):
#   19092 PLAINTEXT       no authentication (the tests' and the demo's default)
#   19093 CONTROLLER      KRaft controller, PLAINTEXT, not for clients
#   19094 SASL_PLAINTEXT  SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
#   19095 SASL_SSL        the same mechanisms over TLS (certificate from the script's CA)
#   19096 SSL             TLS with a required client certificate (mutual TLS)
# SASL users (test credentials of this local broker only): gpuledger / gpuledger-secret.
# The CA, server and client certificates are generated with openssl into $HOME_DIR/pki.
#
# Everything lives outside the repository: jars in $GPULEDGER_KAFKA_CACHE
# (~/.cache/gpuledger/kafka-<version>), data, config, certificates and logs in
# $GPULEDGER_KAFKA_HOME (/tmp/gpuledger-kafka). Every command is idempotent; `up` restarts
# a running broker whose configuration differs from the one this script writes (e.g. one
# started by an older version of the script, without the SASL and TLS listeners).
set -euo pipefail

VERSION=${KAFKA_VERSION:-4.1.1}
LOG4J_VERSION=${LOG4J_VERSION:-2.25.3}
SLF4J_VERSION=${SLF4J_VERSION:-2.0.17}
CACHE=${GPULEDGER_KAFKA_CACHE:-$HOME/.cache/gpuledger/kafka-$VERSION}
HOME_DIR=${GPULEDGER_KAFKA_HOME:-/tmp/gpuledger-kafka}
PORT=${GPULEDGER_KAFKA_PORT:-19092}
CONTROLLER_PORT=${GPULEDGER_KAFKA_CONTROLLER_PORT:-19093}
SASL_PORT=${GPULEDGER_KAFKA_SASL_PORT:-19094}
SASL_SSL_PORT=${GPULEDGER_KAFKA_SASL_SSL_PORT:-19095}
SSL_PORT=${GPULEDGER_KAFKA_SSL_PORT:-19096}
# Test credentials of the local broker; tests/kafkakit.py knows them too.
SASL_USER=gpuledger
SASL_PASSWORD=gpuledger-secret
HEAP=${GPULEDGER_KAFKA_HEAP:-768m}
READY_TIMEOUT_S=${GPULEDGER_KAFKA_READY_TIMEOUT:-120}
# A fixed cluster id: the data directory is ours alone, and a fixed id makes `format`
# reproducible (any base64 UUID of 16 bytes will do).
CLUSTER_ID=gpuledgerKRaft00000000A
PIDFILE=$HOME_DIR/kafka.pid
LOG=$HOME_DIR/kafka.log
PKI=$HOME_DIR/pki

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

pki() {
  # A CA, a server certificate for 127.0.0.1/localhost and a client certificate, made
  # once. Kafka reads PEM directly (ssl.keystore.type=PEM): the keystore file is the
  # unencrypted PKCS#8 key followed by the certificate chain.
  if [[ -f $PKI/.complete ]]; then
    return 0
  fi
  rm -rf "$PKI"
  mkdir -p "$PKI"
  local days=3650
  (
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days "$days" \
      -subj "/CN=gpuledger test CA" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign"
    for who in server client; do
      openssl req -newkey rsa:2048 -nodes -keyout "$who.key.tmp" -out "$who.csr" \
        -subj "/CN=gpuledger-$who"
      openssl pkcs8 -topk8 -nocrypt -in "$who.key.tmp" -out "$who.key"
      printf '%s\n' "basicConstraints=CA:FALSE" \
        "subjectAltName=IP:127.0.0.1,DNS:localhost" \
        "extendedKeyUsage=$([[ $who == server ]] && echo serverAuth || echo clientAuth)" \
        >"$who.ext"
      openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -out "$who.pem" -days "$days" -extfile "$who.ext"
      rm -f "$who.key.tmp" "$who.csr" "$who.ext"
    done
    cat server.key server.pem ca.pem >server-keystore.pem
    chmod 600 ./*.key server-keystore.pem
  ) >"$HOME_DIR/pki.log" 2>&1 || { cat "$HOME_DIR/pki.log" >&2; log "pki failed"; exit 1; }
  touch "$PKI/.complete"
}

write_config() {
  # Writes the broker's configuration to $1.
  # Settings for one machine and fast tests: replication factor 1 everywhere, no initial
  # rebalance delay, short minimum session timeouts so a dead consumer is noticed in
  # seconds, and quick cleanup of transactions a killed producer left open.
  # Brokers and the controller talk over PLAINTEXT; the SASL and TLS listeners are for
  # clients. There is no authorizer: an authenticated user may do anything.
  local plain_users="user_$SASL_USER=\"$SASL_PASSWORD\""
  cat >"$1" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT,SASL_SSL://127.0.0.1:$SASL_SSL_PORT,SSL://127.0.0.1:$SSL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT,SASL_SSL://127.0.0.1:$SASL_SSL_PORT,SSL://127.0.0.1:$SSL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required $plain_users;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required $plain_users;
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location=$PKI/server-keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$PKI/ca.pem
listener.name.ssl.ssl.client.auth=required
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
}

write_log_config() {
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
  (exec 3<>"/dev/tcp/127.0.0.1/${1:-$PORT}") 2>/dev/null
}

CLIENT_PORTS=("$PORT" "$SASL_PORT" "$SASL_SSL_PORT" "$SSL_PORT")

ready() {
  # The port opens before the broker has caught up with the controller; the log line is
  # written once it serves requests. Every client listener must answer: a broker started
  # from an older configuration lacks some of them.
  local p
  for p in "${CLIENT_PORTS[@]}"; do
    port_open "$p" || return 1
  done
  grep -q "Kafka Server started" "$HOME_DIR/server.log" 2>/dev/null
}

add_scram_users() {
  # SCRAM credentials live in the cluster metadata, so they are added through the admin
  # API once per data directory (a stamp in it), not in server.properties.
  local stamp="$HOME_DIR/data/.scram-$SASL_USER"
  if [[ -f $stamp ]]; then
    return 0
  fi
  local mech
  for mech in SCRAM-SHA-256 SCRAM-SHA-512; do  # one mechanism per request
    java_cmd kafka.admin.ConfigCommand --bootstrap-server "127.0.0.1:$PORT" --alter \
      --entity-type users --entity-name "$SASL_USER" --add-config "$mech=[password=$SASL_PASSWORD]" \
      >"$HOME_DIR/scram.log" 2>&1 || { cat "$HOME_DIR/scram.log" >&2; log "adding $mech user failed"; exit 1; }
  done
  touch "$stamp"
}

up() {
  fetch
  mkdir -p "$HOME_DIR/data"
  # One `up` at a time: a second one waits, then finds the broker running.
  exec 9>"$HOME_DIR/.up.lock"
  flock 9
  pki
  write_config "$HOME_DIR/server.properties.new"
  if running; then
    if cmp -s "$HOME_DIR/server.properties.new" "$HOME_DIR/server.properties"; then
      if ready; then
        rm -f "$HOME_DIR/server.properties.new"
        add_scram_users
        log "already running on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
        return 0
      fi
      # Same configuration, still starting: wait for it below.
    else
      log "the running broker has an older configuration; restarting it"
      down
    fi
  fi
  if ! running; then
    local p
    for p in "${CLIENT_PORTS[@]}" "$CONTROLLER_PORT"; do
      if port_open "$p"; then
        log "port $p is taken by a process this script did not start"
        exit 1
      fi
    done
  fi
  mv "$HOME_DIR/server.properties.new" "$HOME_DIR/server.properties"
  write_log_config
  if [[ ! -f $HOME_DIR/data/meta.properties ]]; then
    java_cmd kafka.tools.StorageTool format -t "$CLUSTER_ID" \
      -c "$HOME_DIR/server.properties" --ignore-formatted >"$HOME_DIR/format.log" 2>&1 \
      || { cat "$HOME_DIR/format.log" >&2; exit 1; }
  fi
  if ! running; then
    : >"$HOME_DIR/server.log"
    # setsid: the broker outlives the make/pytest process that started it. 9>&-: it must
    # not inherit the lock of `up`.
    setsid nohup bash -c "$(declare -f java_cmd); HEAP=$HEAP HOME_DIR=$HOME_DIR CACHE=$CACHE \
      java_cmd kafka.Kafka '$HOME_DIR/server.properties'" >"$LOG" 2>&1 </dev/null 9>&- &
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
  add_scram_users
  log "ready on 127.0.0.1:$PORT (SASL_PLAINTEXT :$SASL_PORT, SASL_SSL :$SASL_SSL_PORT, SSL :$SSL_PORT)"
}

bootstrap() {
  case ${1:-plaintext} in
    plaintext) echo "127.0.0.1:$PORT" ;;
    sasl_plaintext) echo "127.0.0.1:$SASL_PORT" ;;
    sasl_ssl) echo "127.0.0.1:$SASL_SSL_PORT" ;;
    ssl) echo "127.0.0.1:$SSL_PORT" ;;
    *) echo "usage: $0 bootstrap [plaintext|sasl_plaintext|sasl_ssl|ssl]" >&2; exit 2 ;;
  esac
}

listeners() {
  echo "plaintext 127.0.0.1:$PORT"
  echo "sasl_plaintext 127.0.0.1:$SASL_PORT"
  echo "sasl_ssl 127.0.0.1:$SASL_SSL_PORT"
  echo "ssl 127.0.0.1:$SSL_PORT"
  echo "sasl_user $SASL_USER"
  echo "pki $PKI"
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
  bootstrap) bootstrap "${2:-plaintext}" ;;
  listeners) listeners ;;
  *) echo "usage: $0 fetch|up|down|status|reset|bootstrap [LISTENER]|listeners" >&2; exit 2 ;;
esac
