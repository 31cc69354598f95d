"""The timing engine `bench` and `--optimize auto` share: interleaving, concurrency, statistics."""

from __future__ import annotations

import threading
import time

from modelport.runtimes.timing import Subject, measure, median_ms, peak_rss_bytes, rss_bytes, stats


def test_subjects_are_measured_round_robin():
    order = []
    subjects = [Subject(name, lambda n=name: order.append(n)) for name in ("a", "b", "c")]
    measure(subjects, runs=4, warmup=1)
    assert order[:3] == ["a", "b", "c"]  # warm-up, each in turn
    assert order[3:] == ["a", "b", "c"] * 4 and all(len(s.latencies) == 4 for s in subjects)


def test_concurrency_overlaps_calls_unless_the_runner_is_not_thread_safe():
    live, peak, lock = [0], [0], threading.Lock()

    def call():
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.01)
        with lock:
            live[0] -= 1

    (s,) = measure([Subject("p", call, items=2)], runs=8, warmup=0, concurrency=4)
    assert peak[0] == 4 and len(s.latencies) == 8
    assert stats(s.latencies, s.items, s.busy)["throughput"] > 2 * 8 / sum(s.latencies) * 2  # overlapped: beats serial
    peak[0] = 0
    measure([Subject("s", call, thread_safe=False)], runs=8, warmup=0, concurrency=4)
    assert peak[0] == 1


def test_duration_bounds_the_run_and_stats_are_ordered():
    subjects = [Subject("x", lambda: time.sleep(0.002)), Subject("y", lambda: None)]
    start = time.perf_counter()
    measure(subjects, duration=0.2, warmup=0)
    assert 0.2 <= time.perf_counter() - start < 1.5
    assert len(subjects[0].latencies) == len(subjects[1].latencies) > 5
    st = stats(subjects[0].latencies)
    lat = st["latency_ms"]
    assert 2.0 <= lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] and st["runs"] == len(subjects[0].latencies)
    assert stats([0.001, 0.002, 0.003, 0.004])["latency_ms"]["p50"] == 2.5
    assert 1.5 < median_ms(lambda: time.sleep(0.002), runs=5, warmup=0) < 50
    assert rss_bytes() > 0 and peak_rss_bytes() >= rss_bytes()
