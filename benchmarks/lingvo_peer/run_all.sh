#!/usr/bin/env bash
# Measures the peer alone over the matrix of docs/workloads.md, one fresh
# process per configuration, then prints the table (results_table.py).
#
#   PEER_VENV=/tmp/lingvo-peer-venv bash benchmarks/lingvo_peer/run_all.sh
#
# Writes <name>.json (one JSON object) and <name>.log (stderr) per run into
# OUT (default logs/lingvo_peer). STEPS, WARMUP and TMO (seconds per run)
# override 10, 3 and 300. The last run is meant to fail: M=3 does not divide
# the batch of 64.
set -u
cd "$(dirname "$0")/../.."
PY="${PEER_VENV:-/tmp/lingvo-peer-venv}/bin/python"
STEPS="${STEPS:-10}"; WARMUP="${WARMUP:-3}"; TMO="${TMO:-300}"
OUT="${OUT:-logs/lingvo_peer}"
mkdir -p "$OUT"
run() {  # name, bench.py args...
  local name=$1; shift
  echo "== $name: $*"
  timeout "$TMO" "$PY" -m benchmarks.lingvo_peer.bench "$@" --steps "$STEPS" \
      --warmup "$WARMUP" --json > "$OUT/$name.json" 2> "$OUT/$name.log"
  local rc=$?
  echo "   rc=$rc"
  if [ $rc -ne 0 ]; then tail -3 "$OUT/$name.log"; fi
}
FFN="--workload ffn --layers 16 --dim 512 --hidden 2048 --batch 64"
TR="--workload transformer --layers 8 --dim 256 --heads 4 --hidden 1024 --batch 16 --seq 64"
run ffn_baseline $FFN --baseline
for K in 1 2 4; do for M in 1 4 16; do
  run "ffn_K${K}_M${M}" $FFN --partitions "$K" --micro_batches "$M"
done; done
run tr_baseline $TR --baseline
for M in 1 4 8; do run "tr_K4_M${M}" $TR --partitions 4 --micro_batches "$M"; done
run ffn_K2_M3_invalid $FFN --partitions 2 --micro_batches 3
python3 -m benchmarks.lingvo_peer.results_table "$OUT"
