#!/usr/bin/env bash
# Runs on the device machine from the project root: the device-bench bundle's environment (run.sh's, up to the
# harness), then the harness once per project tree named in $1 (comma-separated names of project-<name>.tar.xz),
# with the remaining options; each run's results go to $OUT/<name>-<n>/.
set -u
B=$(cd "$(dirname "$0")" && pwd)
names=$1; shift
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null), $(nproc) cores, $(python3 --version)"
W=/tmp/device-bench && mkdir -p $W
for t in site312 np1 triton312; do
  m=$(md5sum "$B/$t.tar.xz" | cut -c1-12)
  [ -f $W/$t/.ok-$m ] || { rm -rf $W/$t && mkdir -p $W/$t && tar -xJf "$B/$t.tar.xz" -C $W/$t && touch $W/$t/.ok-$m; }
done
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
if [ ! -e "$SP/numpy.device-bench" ]; then
  mv "$SP/numpy" "$SP/numpy.device-bench"
  for d in "$SP"/numpy-2*.dist-info "$SP/numpy.libs" "$SP/sklearn"; do [ -e "$d" ] && mv "$d" "$d.device-bench"; done
  cp -r $W/np1/numpy $W/np1/numpy-*.dist-info $W/np1/numpy.libs "$SP/"
fi
S=$W/triton312/pytriton/tritonserver
mkdir -p $W/backends && rm -rf $W/backends/python && cp -r $S/backends/python $W/backends/
cp $S/python_backend_stubs/3.12/triton_python_backend_stub $W/backends/python/
chmod +x $S/bin/tritonserver $W/backends/python/triton_python_backend_stub
export LD_LIBRARY_PATH=$W/triton312/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$(dirname "$(command -v python3)"):$PATH
export PYTHONUNBUFFERED=1
export COG_TRITON_TRITONSERVER=$S/bin/tritonserver COG_TRITON_BACKEND_DIR=$W/backends
mkdir -p "$B/model/checkpoint" && tar -xzf "$B"/model/*.tar.gz -C "$B/model/checkpoint"
n=0
rm -rf "$W/res" && mkdir -p "$W/res"
for name in ${names//,/ }; do
  n=$((n+1))
  P=$W/project-$name
  [ -d $P ] || { mkdir -p $P && tar -xJf "$B/project-$name.tar.xz" -C $P; }
  o="$W/res/$n-$name" && rm -rf "$o" && mkdir -p "$o"
  echo "=== $n $name $(date +%T)"
  (cd $P && rm -rf build/benchmark && PYTHONPATH=$W/site312:$P python3 -m benchmarks.harness \
     --archive "$(ls "$B"/model/*.tar.gz)" "$@" > "$o/benchmark.log" 2>&1; echo "rc=$?" >> "$o/benchmark.log"
   cp build/benchmark/results.* "$o/" 2>/dev/null
   for f in build/benchmark/work/cog.log build/benchmark/work/triton.log; do
     [ -f $f ] && tail -c 300000 $f > "$o/$(basename $f)"; done)
  { echo "## $n $name"; cat "$o/results.md" 2>/dev/null; } >> "$OUT/summary.md"
  grep -v '^$' "$o/benchmark.log" | grep -E "^\| (tensorrt_llm|cog) " | head -4
  tar -czf "$OUT/results.tgz" -C "$W/res" .
done
tar -czf "$OUT/results.tgz" -C "$W/res" .
