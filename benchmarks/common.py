"""Timing shared by the benchmarks: warm-up, then the median of several synchronized runs."""
import statistics
import time


def median_time(fn, warmup, reps, sync):
    """Median wall time of fn() over `reps` runs after `warmup` runs; sync() waits for the device."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
