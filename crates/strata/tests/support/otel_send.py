"""Sends metrics to Strata with the OpenTelemetry Python SDK and its OTLP/HTTP (protobuf)
exporter, as an instrumented service would: a counter, an up-down counter, an explicit-bucket
histogram, an exponential histogram and an observable gauge, under a resource with
service.name, service.namespace, service.instance.id and one more attribute.

Usage: otel_send.py ENDPOINT   (e.g. http://127.0.0.1:9090/api/v1/otlp/v1/metrics)
Prints "sent" once the exporter has flushed successfully; exits 1 otherwise.
"""
import sys

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

endpoint = sys.argv[1]
exporter = OTLPMetricExporter(endpoint=endpoint)
reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
resource = Resource.create({
    "service.name": "checkout",
    "service.namespace": "shop",
    "service.instance.id": "pod-1",
    "deployment.environment": "test",
})
views = [View(instrument_name="payload.size", aggregation=ExponentialBucketHistogramAggregation(max_size=20))]
provider = MeterProvider(resource=resource, metric_readers=[reader], views=views)
meter = provider.get_meter("strata.test", "1.0")

requests = meter.create_counter("http.server.requests", unit="{request}", description="Requests served.")
requests.add(3, {"http.method": "GET", "http.status_code": 200})
requests.add(4, {"http.method": "GET", "http.status_code": 200})
requests.add(1, {"http.method": "POST", "http.status_code": 500})

inflight = meter.create_up_down_counter("http.server.active_requests", unit="{request}")
inflight.add(5)
inflight.add(-2)

duration = meter.create_histogram("http.server.duration", unit="s")
for v in [0.003, 0.02, 0.02, 0.3, 7.0]:
    duration.record(v, {"http.method": "GET"})

size = meter.create_histogram("payload.size", unit="By")
for v in [1, 2, 3, 100, 1000, 1000]:
    size.record(v)

meter.create_observable_gauge("queue.length", callbacks=[lambda options: [Observation(12.5, {"queue": "main"})]])

ok = provider.force_flush(timeout_millis=10_000)
provider.shutdown()
print("sent" if ok else "flush failed")
sys.exit(0 if ok else 1)
