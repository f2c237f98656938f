"""Summarise the segment trace of burst-trace.patch (lines of name:monotonic:thread_time marks, one line per
prediction): each step's wall and thread CPU time, ms. Usage: python3 an_segments.py seg-trace-*.txt"""
import sys

segs: dict[str, list[tuple[float, float]]] = {}
for path in sys.argv[1:]:
    for line in open(path):
        marks = [(p.split(":")[0], float(p.split(":")[1]), float(p.split(":")[2])) for p in line.split()]
        for (n0, a0, c0), (n1, a1, c1) in zip(marks, marks[1:]):
            segs.setdefault(f"{n0}->{n1}", []).append(((a1 - a0) * 1e3, (c1 - c0) * 1e3))
for name, values in segs.items():
    wall, cpu = sorted(v for v, _ in values), sorted(c for _, c in values)
    q = lambda d, p: d[min(len(d) - 1, int(p / 100 * len(d)))]  # noqa: E731
    print(f"{name:10s} wall p50 {q(wall, 50):7.3f} p90 {q(wall, 90):7.3f} max {wall[-1]:7.2f} sum {sum(wall):8.1f}"
          f" | cpu p50 {q(cpu, 50):6.3f} p90 {q(cpu, 90):6.3f} sum {sum(cpu):7.1f}")
