#!/usr/bin/env bash
# Cuts the text targets' starting corpus from real inputs: PromQL expressions from Prometheus'
# own test files, scrapes from the node_exporter recording, and the configuration examples
# below. Run once from `fuzz/` with ../../shared present; the output is kept in the repository.
set -euo pipefail
shared=${SHARED:-../../shared}
cd "$(dirname "$0")"

mkdir -p corpus/promql corpus/exposition corpus/config_yaml corpus/web_config

# PromQL: the expression of every `eval` line (instant and range forms), deduplicated.
n=0
for f in "$shared"/promql-tests/*.test; do
  sed -nE 's/^eval(_fail|_warn|_info|_ordered)? +(instant +at +[^ ]+|range +from +[^ ]+ +to +[^ ]+ +step +[^ ]+) +(.*)$/\3/p' "$f"
done | sort -u | while IFS= read -r q; do
  n=$((n + 1))
  printf '%s' "$q" > "corpus/promql/eval-$n"
done

# Exposition: the first byte picks the format ('0' text, '1' OpenMetrics), then a scrape.
{ zcat "$shared"/data/node-exporter-600x10s.om.gz || true; } | head -400 > /tmp/strata-seed-om
{ printf '1'; cat /tmp/strata-seed-om; printf '# EOF\n'; } > corpus/exposition/openmetrics-node
{ printf '0'; sed -E 's/ [0-9]+\.[0-9]{3}$//' /tmp/strata-seed-om | grep -v '^# EOF'; } > corpus/exposition/text-node
rm /tmp/strata-seed-om
cat > corpus/exposition/text-kinds <<'TXT'
0# HELP http_request_duration_seconds Latency.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{le="0.1",path="/a\"b\\c\n"} 3 1700000000000
http_request_duration_seconds_bucket{le="+Inf",path="/a\"b\\c\n"} 5 1700000000000
http_request_duration_seconds_sum{path="/a\"b\\c\n"} 1.5e+00
http_request_duration_seconds_count{path="/a\"b\\c\n"} 5
# TYPE rpc summary
rpc{quantile="0.99"} NaN
rpc_sum -Inf
rpc_count +Inf
{"utf8.metric name", le="1"} 1
TXT
cat > corpus/exposition/openmetrics-kinds <<'TXT'
1# TYPE foo counter
# UNIT foo seconds
# HELP foo Escaped \" and \\ and \n.
foo_total{a="b"} 17.0 1520879607.789 # {trace_id="KOO5S4vxi0o"} 0.67
foo_created{a="b"} 1520430000.123
# TYPE g gaugehistogram
g_bucket{le="0.01"} 20.0
g_bucket{le="+Inf"} 30.0
g_gcount 30.0
g_gsum 1.2
# TYPE s stateset
s{s="a"} 1
s{s="b"} 0
# TYPE i info
i_info{version="1.0"} 1
# EOF
TXT

# The configuration file: storage, limits, global, scrape_configs with relabeling and discovery.
cat > corpus/config_yaml/full <<'YAML'
storage:
  retention: 30d
  retention_size: 500GB
  wal_fsync: always
limits:
  write_max_body_size: 64MB
  query_timeout: 1m
  query_max_concurrency: 8
  query_max_depth: 200
global:
  scrape_interval: 15s
  scrape_timeout: 10s
  external_labels: {dc: eu1}
scrape_configs:
  - job_name: node
    honor_labels: true
    metrics_path: /metrics
    params: {format: [prometheus]}
    static_configs:
      - targets: ['localhost:9100', 'host-2:9100']
        labels: {env: prod}
    file_sd_configs:
      - files: ['targets/*.json']
        refresh_interval: 1m
    relabel_configs:
      - source_labels: [__address__]
        regex: '(.*):(\d+)'
        target_label: host
        replacement: '${1}'
      - action: labelmap
        regex: __meta_(.+)
      - action: hashmod
        source_labels: [instance]
        modulus: 4
        target_label: shard
    metric_relabel_configs:
      - action: drop
        source_labels: [__name__]
        regex: 'go_.*'
      - action: keep
        regex: '(?i)node_(cpu|memory).*'
        source_labels: [__name__]
YAML
printf 'scrape_configs:\n  - job_name: a\n    static_configs: [{targets: [x:1]}]\n' > corpus/config_yaml/minimal

# --web.config.file (exporter-toolkit's format).
cat > corpus/web_config/full <<'YAML'
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  min_version: TLS12
  max_version: TLS13
http_server_config:
  headers:
    Strict-Transport-Security: max-age=31536000
    X-Frame-Options: deny
basic_auth_users:
  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze
YAML
printf 'basic_auth_users:\n  bob: $2b$04$abcdefghijklmnopqrstuu8Vz7Wm9F8Xz1x1x1x1x1x1x1x1x1x1\n' > corpus/web_config/users
printf 'basic_auth_users:\n  alice: $2y$04$abcdefghijklmnopqrstuuJ0dvQ6Pq0y9n8v8Yc1mM8lI2Nw5b9uO\n  bob: $2y$04$abcdefghijklmnopqrstuuJ0dvQ6Pq0y9n8v8Yc1mM8lI2Nw5b9uO\nstrata_authorization:\n  read: [alice]\n  write: [bob]\n  admin: [alice]\n' > corpus/web_config/authorization

# Carbon: plaintext lines of every shape, and one pickled message per pickle protocol (Python's
# own pickler, when there is a python3).
mkdir -p corpus/carbon_plaintext corpus/carbon_pickle
printf 'sys.cpu.load 0.5 1700000000\na.b\t-1e3 1700000000.25\r\ndisk.used;host=a;dc=eu 3 -1\nno.timestamp 4\nbad line here too\n' > corpus/carbon_plaintext/lines
if command -v python3 >/dev/null; then
  python3 - <<'PY'
import pickle
pts = [("sys.cpu.load", (1700000000, 0.5)), ("sys.cpu.load", (1700000010.25, 1)),
       ("disk.used;host=a;dc=eu", (1700000000, 3.0)), ("a.b", (-1, "2.5")),
       ("a.nan", (1700000000, float("nan"))), ("bad", (1,)), ("big", (2**70, 1))]
for proto in range(6):
    with open("corpus/carbon_pickle/protocol-%d" % proto, "wb") as f:
        f.write(pickle.dumps(pts, protocol=proto))
PY
fi
echo "promql: $(ls corpus/promql | wc -l) seeds"
