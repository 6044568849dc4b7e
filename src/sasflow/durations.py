"""Durations kept by hand for Prometheus: a histogram whose observation costs a
bisect and two additions, made into samples by prometheus_client when scraped.

The worker times every agent request (metrics.py, `sasflow_step_duration_seconds`),
so the observation is paid at every step.
"""

from __future__ import annotations

import bisect
import threading

from prometheus_client.core import HistogramMetricFamily, Metric

__all__ = ["Durations", "Series"]


class Series:
    """One labelled series of a `Durations`: observations per bucket, and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # ending with +Inf
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.total = 0.0

    def observe(self, amount: float) -> None:
        # the bucket is the first whose bound is >= amount (le: less than or equal)
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1
        self.total += amount


class Durations:
    """A histogram kept by hand and made into samples when scraped (a custom collector).

    prometheus_client's Histogram.observe takes a lock twice and walks the bounds
    one by one: five to nine times what `Series.observe` costs (bench/observe_cost.py).
    The library still writes the samples. A series is observed from one thread,
    the loop the roles run on, so it needs no lock; a scrape from the HTTP
    server's thread copies the counts first and may miss an observation made
    meanwhile, as the library's own histogram may.
    """

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...],
                 bounds: tuple[float, ...]) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = labels
        # as the library writes them: 0.001, 1.0, +Inf
        self._bounds = (*bounds, float("inf"))
        self._le = ["+Inf" if bound == float("inf") else repr(bound) for bound in self._bounds]
        self._series: dict[tuple[str, ...], Series] = {}
        self._lock = threading.Lock()  # making a series, not observing

    def series(self, *labels: str) -> Series:
        """The series of these label values, made (at 0) on first use."""
        with self._lock:
            found = self._series.get(labels)
            if found is None:
                found = self._series[labels] = Series(self._bounds)
            return found

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labels)]

    def collect(self) -> list[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labels)
        with self._lock:
            series = list(self._series.items())
        for labels, one in series:
            counts, total = list(one.counts), one.total
            cumulative, buckets = 0, []
            for le, count in zip(self._le, counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(list(labels), buckets, total)
        return [family]
