import sys, collections, statistics
model, loadgen, conc = sys.argv[1], sys.argv[2], int(sys.argv[3])
ev = collections.defaultdict(dict); xs = []; acc = []; last = None
for line in open(model):
    k, t, n, _ = line.split(); t = float(t)
    if k == "x": xs += [t] * int(n); last = t
    elif k == "a":
        acc.append(t - last); last = t
    else: ev[int(n)].setdefault(k, t)
nums = sorted(ev)
xt = dict(zip(nums, xs)) if len(xs) == len(nums) else {}
blocks = open(loadgen).read().split("# run\n")
lg = sorted((float(s), float(s) + float(f)) for _, s, f in (l.split() for l in blocks[-1].splitlines() if l.strip()))
t0 = lg[0][0] - 0.05
sel = [n for n in nums if xt.get(n, 0) >= t0 and all(k in ev[n] for k in "crse")]
if acc:
    a = sorted(acc); print("execute(): one request taken in (us) p50 %.0f p90 %.0f mean %.0f" % (1e6 * a[len(a) // 2], 1e6 * a[int(len(a) * .9)], 1e6 * sum(a) / len(a)))
print(f"model requests in window {len(sel)}, loadgen {len(lg)}, x/numbers {len(xs)}/{len(nums)}")
starts = [s for s, _ in lg]; firsts = sorted(f for _, f in lg)
xsel = sorted(xt[n] for n in sel); esel = sorted(ev[n]["e"] for n in sel)
def q(v):
    v = sorted(v); return "%6.1f / %6.1f / %6.1f ms" % tuple(1e3 * v[min(len(v) - 1, int(len(v) * p))] for p in (0.5, 0.9, 0.99))
rounds = {"all": slice(0, None), "round 2+": slice(conc, None)}
for name, sl in rounds.items():
    idx = range(len(starts))[sl]
    print(f"-- {name} (p50 / p90 / p99), {len(idx)} requests")
    if len(xsel) == len(starts):
        print("loadgen start -> execute()        ", q([xsel[i] - starts[i] for i in idx]))
    # per-request (exact) steps, for requests whose rank in execute order is in the slice
    order = sorted(sel, key=lambda n: xt[n])[sl]
    print("execute() -> coroutine            ", q([ev[n]["c"] - xt[n] for n in order]))
    print("coroutine -> first result         ", q([ev[n]["r"] - ev[n]["c"] for n in order]))
    print("first result -> send begins       ", q([ev[n]["s"] - ev[n]["r"] for n in order]))
    print("send                              ", q([ev[n]["e"] - ev[n]["s"] for n in order]))
    print("execute() -> first send ends      ", q([ev[n]["e"] - xt[n] for n in order]))
    if len(esel) == len(firsts):
        fsel = sorted(range(len(firsts)), key=lambda i: firsts[i])
        print("first send ends -> client (sorted)", q([firsts[i] - esel[i] for i in range(len(firsts))][sl]))
    print("client TTFT                       ", q([f - s for s, f in lg[sl]]))
