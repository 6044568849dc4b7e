"""A process whose host clock is wrong: on PYTHONPATH, it shifts this process's wall
clock (`time.time`, `time.time_ns`) by $SASFLOW_TEST_CLOCK_SKEW seconds (R1 tests).

Python imports `sitecustomize` at start-up from the first directory on its path
that has one, before any application code, so every later `time.time()` of the
process, sasflow's and its libraries', reads the skewed clock, as on a host
whose clock is off. The monotonic clock is left alone, as NTP leaves it.
"""

from __future__ import annotations

import os
import time

_skew = float(os.environ.get("SASFLOW_TEST_CLOCK_SKEW") or 0.0)
if _skew:
    _time, _time_ns = time.time, time.time_ns

    def _skewed() -> float:
        return _time() + _skew

    def _skewed_ns() -> int:
        return _time_ns() + int(_skew * 1e9)

    time.time = _skewed
    time.time_ns = _skewed_ns
