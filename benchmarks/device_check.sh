#!/usr/bin/env bash
# Issue 10's checks on a lent CUDA machine, in the order that matters if time runs out. Each step's
# log and JSON go to $OUT (default ./device-out). Run from the project root after the device recipe in
# ../shared/gpu/README.md (install.sh, then `export PYTHONPATH=/tmp/site:/tmp/project`):
#     bash benchmarks/device_check.sh [SECONDS]      # SECONDS: the whole budget (default 480)
# 1. the GPU kernels on the device: tolerance and rows bit-equal (FMA qmm, tensor-core qmm at 1/2/4
#    tiles, dense, attention)
# 2. greedy speculation == plain decoding with the invariant kernels (the exactness suite's core)
# 3. bench_gpu.py: ops (the issue's qmm table, both CUDA kernels, attention at 300 and 8,192 keys),
#    8B-shape forwards, the engine on SmolLM2 (--model), the families
# 4. `mlxspec bench` on SmolLM2 (when staged): exact flag, speedups, the device's own bandwidth
# 5. the test suite on the device, server tests aside (the image lacks their clients)
set -uo pipefail
budget=${1:-480}
out=${OUT:-device-out}
mkdir -p "$out"
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
step() {  # step NAME SECONDS COMMAND...: run with the smaller of SECONDS and what is left
  local name=$1 want=$2; shift 2
  local t; t=$(left); (( t > want )) && t=$want
  if (( t < 20 )); then echo "skipped $name: out of time" | tee -a "$out/summary.txt"; return; fi
  echo "== $name (${t}s)" | tee -a "$out/summary.txt"
  timeout "$t" "$@" > "$out/$name.log" 2>&1
  echo "   rc=$? $(tail -n 1 "$out/$name.log")" | tee -a "$out/summary.txt"
}
export MLXSPEC_KERNELS=exact  # the invariant kernels, whatever they cost
python3 -c "import mlx.core as mx; print(mx.__version__, mx.default_device(), mx.device_info())" > "$out/device.txt" 2>&1
nvidia-smi >> "$out/device.txt" 2>&1
step kernels 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gpu_on_device.py
step exactness 150 python3 -m pytest -q -p no:cacheprovider -rf tests/test_decode_greedy.py -k "speculative_equals_plain"
model=()
[ -f /var/tmp/stash/smol.gguf ] && model=(--model /var/tmp/stash/smol.gguf)
step bench 300 python3 benchmarks/bench_gpu.py --out "$out/gpu.json" "${model[@]}"
[ -f /var/tmp/stash/smol.gguf ] && step mlxspec-bench 120 python3 -m mlxspec bench /var/tmp/stash/smol.gguf \
  --repeats 2 --no-peers --json "$out/bench_smol.json" --markdown
step suite 600 python3 -m pytest -q -p no:cacheprovider -n 8 -rf tests --ignore=tests/server
echo "done in $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
