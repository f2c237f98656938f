# call 10: appended to .device-bench/run.sh's lines up to 'cd $W/project' (its environment); micro.py as committed here
exec > >(tee "$OUT/micro.txt") 2>&1
python3 -c "import sys, sysconfig; print(sys.version); print(sysconfig.get_config_var('CONFIG_ARGS')); print(sys.flags)"
lscpu | grep -i 'model name\|^cpu(s)\|thread(s) per core\|mhz' ; uptime
for i in 1 2; do python3 $B/micro.py idle$i 2>/dev/null; done
ts() { while IFS= read -r l; do echo "$(date +%s) $l"; done; }
(python3 -m benchmarks.harness --archive "$(ls "$B"/model/*.tar.gz)" --paths tensorrt_llm,cog --points 256@10 \
  --rounds 8 --batch-limit 256 2>&1 | ts > "$OUT/bench.log") &
H=$!
while kill -0 $H 2>/dev/null; do python3 $B/micro.py "load@$(date +%s)" 2>/dev/null; uptime; sleep 1; done
grep -v '^[0-9]* $' "$OUT/bench.log" | tail -45
cp build/benchmark/results.md "$OUT/" 2>/dev/null
for i in 1 2; do python3 $B/micro.py after$i 2>/dev/null; done
