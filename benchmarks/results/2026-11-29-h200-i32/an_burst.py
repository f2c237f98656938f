import sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/burst-trace-*.txt")):
    runs = []; lags = []
    for line in open(f):
        k, a, b = line.split()
        (runs if k == "run" else lags).append((float(a), float(b)))
    if not runs: continue
    d = sorted((b - a) * 1e3 for a, b in runs)
    q = lambda p: d[min(len(d) - 1, int(p / 100 * len(d)))]
    print(f, "predictions", len(d), "called->run ms p50 %.2f p90 %.2f p99 %.2f max %.2f" % (q(50), q(90), q(99), d[-1]))
    if lags:
        L = sorted(l * 1e3 for _, l in lags)
        print("  loop lags >1ms:", len(L), "p50 %.1f max %.1f sum %.0f ms" % (L[len(L)//2], L[-1], sum(L)))
