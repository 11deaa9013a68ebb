"""OpenTelemetry spans inside Serve's request traces.

Serve sets the tracer provider when `tracing_config` is enabled in serve_config.yaml;
without it these spans are no-ops. `file_exporter` is an exporter entry point that
writes finished spans as JSON lines to WATTWISE_SPANS_FILE (default /tmp/ray/wattwise_spans.jsonl).
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

tracer = trace.get_tracer("wattwise")


def file_exporter() -> list:
    path = os.environ.get("WATTWISE_SPANS_FILE", "/tmp/ray/wattwise_spans.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the exporter's (the process's) lifetime
    exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    return [SimpleSpanProcessor(exporter)]
