"""Per-call cost of two pure-Python steps of a prediction's start (validating the inputs, one log line), outside
coglet: in a warm loop, and one call at a time after 64 MiB have been written (caches evicted, as a call made between
other threads' and processes' work runs). A diagnostic for the README's call 10, not a benchmark.

    PYTHONPATH=. python3 benchmarks/results/2026-11-29-h200-i32/micro.py TAG 2>/dev/null

Prints one line per step: median microseconds per call, wall and thread CPU.
"""
import ctypes
import gc
import logging
import sys
import time

from cog_triton.worker.inputs import validate_inputs


def warm(fn, n):
    """The median over 5 runs of ``n`` calls in a row: microseconds per call, (wall, thread CPU)."""
    fn()
    runs = []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            fn()
        runs.append(((time.perf_counter() - t0) / n * 1e6, (time.thread_time() - c0) / n * 1e6))
    runs.sort()
    return runs[len(runs) // 2]


junk = (ctypes.c_char * (64 << 20))()
junk_at = ctypes.addressof(junk)


def cold(fn, n=200):
    """The median of ``n`` single calls, each after writing 64 MiB: microseconds, (wall, thread CPU)."""
    walls, cpus = [], []
    for i in range(n):
        ctypes.memset(junk_at, i & 255, 64 << 20)
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        walls.append((time.perf_counter() - t0) * 1e6)
        cpus.append((time.thread_time() - c0) * 1e6)
    walls.sort()
    cpus.sort()
    return walls[n // 2], cpus[n // 2]


log = logging.getLogger("cog_triton.worker.service")
handler = logging.StreamHandler(sys.stderr)
handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
log.addHandler(handler)
log.setLevel(logging.INFO)
log.propagate = False
prompt = "Write a story about a lighthouse keeper. " * 4
steps = {
    "loop 10k adds": lambda: sum(range(10000)),
    "validate_inputs": lambda: validate_inputs(prompt=prompt, max_tokens=256, temperature=0.7, top_p=0.95, seed=1),
    "log line": lambda: log.info("Triton request id %s, %s", "cog-1234-5678", "seed 1 (given)"),
}
tag = sys.argv[1] if len(sys.argv) > 1 else "run"
for name, fn in steps.items():
    wall, cpu = warm(fn, 300 if name.startswith("loop") else 3000)
    print(f"{tag}: {name}: {wall:.1f} us wall, {cpu:.1f} us cpu (py {sys.version.split()[0]}, gc {gc.isenabled()})",
          flush=True)
for name, fn in steps.items():
    if not name.startswith("loop"):
        wall, cpu = cold(fn)
        print(f"{tag}: {name} (cold caches): {wall:.1f} us wall, {cpu:.1f} us cpu", flush=True)
