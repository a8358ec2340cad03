# pygazette developer entry points. `make test` works on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PORT ?= 8080
# `make serve`'s HTTP port: /metrics, /debug/ready, /debug/live and the journal gateway
# (not 8081: that is `consumer serve`'s default gRPC port).
HTTP_PORT ?= 8090
DATA ?= ./data
PROTOS := pygazette/protocol/pb/protocol.proto pygazette/protocol/pb/retention.proto pygazette/protocol/pb/consumer.proto pygazette/protocol/pb/recoverylog.proto pygazette/protocol/pb/peer.proto

.PHONY: spark-cluster test-spark-cluster bench-spark-cluster demo-pipeline
.PHONY: all venv deps serve test bench-smoke chaos-smoke test-faults unit lint proto bench bench-fragments bench-spark bench-spark-kafka bench-cluster bench-allocator bench-scale bench-peers demo demo-consumer clean interop interop-bin stream-sum-bin interop-go bench-gazette bench-gazette-go s3server-bin chaos image kustomize-bin deploy-test

all: test

# The `spark` extra is part of the development install. The editable install puts the checkout
# on sys.path (a static .pth file: see `package-dir` in pyproject.toml), where PySpark finds the
# top-level module pyspark_gazette and so registers the `gazette` format by itself.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,spark]'
	touch $@

venv: $(VENV)/.installed

# System dependencies that the integration tests run for real (etcd; Java 17 for Spark).
deps: venv
	@./.ci/install-system-deps

serve: venv
	$(VENV)/bin/pygazette serve --port $(PORT) --http-port $(HTTP_PORT) --data-dir $(DATA)

proto: venv
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

lint: venv
	$(VENV)/bin/ruff check pygazette pyspark_gazette tests bench examples
	$(VENV)/bin/mypy pygazette pyspark_gazette

# Servers check every response they send with Gazette's rules (PYGAZETTE_CHECK_RESPONSES=1):
# a response breaking one fails its RPC, and so the test that drove the server into it.
# Most tests wait on processes (brokers, etcd, JVMs), so two workers (TEST_WORKERS) share
# the cores; a test file stays on one worker with its module's fixtures (--dist loadfile).
# The tests' temporary directories (brokers' data, etcd, stores) go on tmpfs where there is
# one (TEST_TMPDIR): creating and removing hundreds of thousands of files is most of what
# they ask of a file system, and on ext4 each creation can cost a millisecond of CPU once
# many files were deleted in the last minutes. The full-disk tests mount their own tmpfs.
TEST_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm,/tmp)
TEST_WORKERS ?= 2
test: deps lint s3server-bin kustomize-bin
	TMPDIR=$(TEST_TMPDIR) PYGAZETTE_CHECK_RESPONSES=1 $(VENV)/bin/pytest -q -n $(TEST_WORKERS) \
		--dist loadfile --ignore=tests/interop -m "not bench_smoke and not spark_cluster_faults"
	TMPDIR=$(TEST_TMPDIR) PYGAZETTE_CHECK_RESPONSES=1 $(MAKE) interop

# Benchmark smoke runs that don't fit make test's time budget (Spark against Kafka's source).
bench-smoke: deps
	$(VENV)/bin/pytest -q -m bench_smoke tests/bench

# Interoperability with Gazette itself (interop/README.md): the released gazette, gazctl and
# etcd are built once from the Go module proxy into interop/bin/; then pygazette's tests
# against them, and the Go conformance suite (Gazette's client against both brokers).
INTEROP_GO_ENV := CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"

interop-bin:
	./interop/build-binaries

# Gazette's stream-sum example (summer: consumer, RocksDB, recovery logs; chunker), built
# once with cgo against Debian's librocksdb-dev into interop/bin/ (interop/build-stream-sum).
stream-sum-bin: deps
	./interop/build-stream-sum

# The S3-compatible server (versitygw) that tests/*/test_real_s3*.py run the s3:// store
# against, built once from the Go module proxy into interop/bin/ (interop/build-s3server).
s3server-bin:
	./interop/build-s3server

# kustomize (deploy/ overlays; tests/deploy renders them), built once from the Go module
# proxy into interop/bin/ (deploy/build-kustomize).
kustomize-bin:
	./deploy/build-kustomize

# The container image (deploy/Containerfile) with podman: BASE=docker.io/library/python:3.11-slim
# for a real build; without BASE, a base built here from Debian packages (mmdebstrap). Installs
# podman, runc and mmdebstrap when missing (deploy/install-podman). README "Deploying".
image: venv interop-bin s3server-bin
	./deploy/build-image

# deploy/overlays/test played with `podman kube play` (tests/deploy/play.py): etcd, S3, three
# brokers, the examples' consumers and Jobs; stream-sum verified through them, across a
# broker pod kill. Several minutes; not part of make test.
deploy-test: image kustomize-bin
	$(PY) -m tests.deploy.play

interop-go: venv interop-bin
	cd interop && PYGAZETTE="$(abspath $(VENV))/bin/pygazette" $(INTEROP_GO_ENV) \
	  "$$(./find-go)" test -tags nozstd -count=1 ./...

# Two workers, as `make test` runs the rest: a test file stays on one worker (--dist loadfile),
# and the figures a test measured reach the summary through its report (tests/interop/conftest.py).
interop: venv interop-bin stream-sum-bin
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile tests/interop
	$(MAKE) interop-go

# The long version of the cluster fault tests (kills, restarts, freezes, scaling; many
# rounds of each). `make test` runs one round of each.
FAULT_ROUNDS ?= 10
test-faults: deps
	PYGAZETTE_FAULT_ROUNDS=$(FAULT_ROUNDS) $(VENV)/bin/pytest -q \
		tests/broker/test_cluster_faults.py --timeout=3600

# The chaos suite (tests/chaos/run.py): stream-sum on etcd, 4 brokers at replication 3 and
# 3 summers, under a seeded schedule of kills, freezes, etcd restarts, partitions and store
# outages for CHAOS_MINUTES; prints a JSON report last. `make chaos-smoke`: a 1-minute run.
CHAOS_MINUTES ?= 10
CHAOS_SEED ?= 1
chaos: deps
	$(PY) -m tests.chaos.run --minutes $(CHAOS_MINUTES) --seed $(CHAOS_SEED)

chaos-smoke: deps
	PYGAZETTE_CHECK_RESPONSES=1 $(VENV)/bin/pytest -q -m chaos_smoke tests/chaos

bench: venv
	$(PY) bench/append_read.py
	$(PY) bench/publish.py

bench-fragments: venv
	$(PY) bench/fragments.py

# The Spark connector's benchmark (needs Java 17, see `make deps`).
bench-spark: deps
	$(PY) bench/spark_read.py

# The gazette source against Spark's Kafka source (spark-sql-kafka-0-10) on the same records;
# fetches the Kafka broker and connector jars with mvn into ~/.cache/pygazette on first use.
bench-spark-kafka: deps
	$(PY) bench/spark_read.py --vs-kafka

# End to end: a local broker, a streaming aggregation journal -> journal on Spark, and a batch
# job turning a journal's fragments into Parquet.
demo: deps
	$(PY) examples/spark_demo.py

# A standalone Spark cluster on loopback (a master and two one-core workers from the pyspark
# package's own spark-class) for trying jobs by hand; prints its spark:// URL, Ctrl-C stops it.
spark-cluster: deps
	$(PY) -m tests.support.spark_cluster --workers $(or $(WORKERS),2)

# The cluster tests of make test (kill -9 of an executor mid-stream among them), then kill -9
# of a driver mid-batch on that cluster (the spark_cluster_faults marker): exactly once.
test-spark-cluster: deps
	$(VENV)/bin/pytest -q tests/spark/test_on_cluster.py tests/spark/test_cluster_faults.py

# Batch reads on the cluster with one worker, then two (rows/s of both).
bench-spark-cluster: deps
	$(PY) bench/spark_read.py --cluster --quick

# events -> Structured Streaming (clean, aggregate) -> exactly-once sink -> a pygazette
# consumer with per-key state -> a Spark batch job over fragment files -> a Parquet report.
demo-pipeline: deps
	$(PY) examples/pipeline/run.py

# The consumer examples end to end: etcd, a broker, two consumer processes each of stream-sum
# (every sum verified exactly once) and word-count (queries that read their writes).
demo-consumer: deps
	$(PY) examples/run_consumer_demo.py

bench-gazette: venv interop-bin
	$(PY) bench/vs_gazette.py

# Both brokers driven by Gazette's own Go client (interop/loadgen): single broker, 3 brokers
# at r=2 and r=3, alternating rounds; GAZETTE_GO_ARGS="--quick --rounds 1" for a short run.
bench-gazette-go: venv interop-bin
	$(PY) bench/vs_gazette.py --go-client $(GAZETTE_GO_ARGS)

bench-cluster: deps
	$(PY) bench/cluster.py

# Gazette's simulated rolling deploy (allocator/benchmark_test.go) for pygazette's allocator
# and for Gazette's (from the Go module cache, with its etcd), at N×10 members × N×2,000
# items; prints one JSON document. ALLOCATOR_ARGS="--sizes 1,2" for a shorter run.
ALLOCATOR_ARGS ?=
bench-allocator: venv
	$(PY) bench/allocator.py $(ALLOCATOR_ARGS)

# K brokers and N journals at replication R, pygazette beside Gazette's broker (interop/bin)
# in the same run: apply, convergence, first appends, RSS per replica, idle CPU and etcd
# writes, restart, allocator moves; SCALE_ARGS="-N 5000 --shards 5000", or "--quick".
SCALE_ARGS ?=
bench-scale: deps interop-bin
	$(PY) bench/scale.py $(SCALE_ARGS)

# pygazette beside Kafka (KRaft, jars from Maven Central cached in ~/.cache/pygazette/kafka),
# NATS JetStream and Redis Streams, all started here; prints one JSON document.
# PEERS_ARGS=--quick for a tiny run, e.g. PEERS_ARGS="--systems pygazette-r1,kafka-1".
PEERS_ARGS ?=
bench-peers: deps
	$(PY) bench/peers.py $(PEERS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
