"""Spans kept in memory, for the tests of sasflow's tracing: the process's
TracerProvider for one test, or none at all, and ways to read what was recorded."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler

from sasflow import tracing

__all__ = ["Spans", "install_provider", "remove_provider"]


class Spans:
    """What a TracerProvider exported, read by kind."""

    def __init__(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        self.provider = provider
        self.exporter = exporter

    def all(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def attempts(self, task_id: str) -> list[ReadableSpan]:
        """The schedulers' attempt spans for `task_id`, in the order they started."""
        return self._of(task_id, lambda span: span.kind is trace.SpanKind.CLIENT)

    def agent_calls(self, task_id: str) -> list[ReadableSpan]:
        """The agents' spans for `task_id`, in the order they started."""
        return self._of(task_id, lambda span: span.kind is trace.SpanKind.SERVER)

    def _of(self, task_id: str, kind: Callable[[ReadableSpan], bool]) -> list[ReadableSpan]:
        found = [span for span in self.all() if kind(span)
                 and (span.attributes or {}).get(tracing.TASK_ID) == task_id]
        return sorted(found, key=lambda span: span.start_time or 0)


def install_provider(monkeypatch: pytest.MonkeyPatch, sampler: Sampler | None = None) -> Spans:
    """Make a TracerProvider that exports to memory this process's, for this test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # the API lets set_tracer_provider() take effect once a process: its global is set
    # here directly, and put back as it was after the test
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    return Spans(provider, exporter)


def remove_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TracerProvider configured, in code or the environment, for this test."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
