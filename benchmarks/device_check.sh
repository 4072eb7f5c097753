#!/usr/bin/env bash
# One prepared accelerator check (issue 53): at most 8 minutes on one GPU, one table.
#
#   bash benchmarks/device_check.sh            # on a GPU machine (../shared/gpu/README.md:
#                                              # the wheels and PYTHONPATH first); table in $OUT
#   bash benchmarks/device_check.sh --tiny     # the CPU check of this script: tiny shapes
#
# Four parts, each under its own time limit (a part that runs out is "not measured" in the
# table, never a guess), their outputs in $OUT (default: a new temporary directory):
#   1. sampler tokens/s, static vs continuous (half the rows as slots), at the Qwen3-0.6B shape
#      with random weights and long-tailed lengths (python -m benchmarks.rollout --setups
#      qwen3_0_6b: the test policy whose LM head is zeroed, geometric lengths of mean 128);
#   2. the RL update's tokens/s and MFU at the Qwen3-0.6B shape (python -m benchmarks.train_step
#      --skip_rl: 64 sequences x 640 tokens, bf16 compute);
#   3. seeds per hour of a population of 16 members against one run (python -m jtc.train of
#      configs/gspo.py, the same steps, no evaluation);
#   4. `jtc plan --gpu` predicted peak memory against the trainer's measured device peak
#      (python -m benchmarks.gpu_preflight, 2 steps).
# The table: python -m benchmarks.device_table $OUT (also printed at the end).
set -uo pipefail

TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
START=$(date +%s)
echo "device_check: results in $OUT (tiny=$TINY)"

part() {  # part NAME SECONDS CMD...: run CMD with a time limit, its output in $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - t0 )) s (limit $limit s)" | tee -a "$OUT/parts.txt"
}

if (( TINY )); then
  part rollout 900 $PY -m benchmarks.rollout --small --setups qwen3_0_6b --slots 1,2 --rounds 1 \
    --json "$OUT/rollout.json"
  part train_step 900 $PY -m benchmarks.train_step --small --skip_rl --repeats 1
  STEPS=1; MEMBERS=2; POP_LIMIT=900; PRE_ARGS="--tiny --steps 1"; PRE_LIMIT=900
  SMOKE=":smoke"
else
  part rollout 110 $PY -m benchmarks.rollout --setups qwen3_0_6b --slots 1,2 --rounds 2 \
    --json "$OUT/rollout.json"
  part train_step 90 $PY -m benchmarks.train_step --skip_rl --model tiny --repeats 2
  STEPS=5; MEMBERS=16; POP_LIMIT=60; PRE_ARGS="--gpu h100 --steps 2"; PRE_LIMIT=150
  SMOKE=""
fi

# 3. Seeds per hour: a population of MEMBERS against one run, each timed by the shell.
for n in 1 "$MEMBERS"; do
  t0=$(date +%s%N)
  part "population_$n" "$POP_LIMIT" $PY -m jtc.train --config "configs/gspo.py$SMOKE" \
    --workdir "$OUT/pop_$n" --config.population.size="$n" --config.num_steps="$STEPS" \
    --config.eval.every=0 --config.log.diagnostics_every=0
  echo "$n $(( ($(date +%s%N) - t0) / 1000000 ))" >> "$OUT/population_ms.txt"
done

part preflight "$PRE_LIMIT" $PY -m benchmarks.gpu_preflight $PRE_ARGS --out "$OUT/preflight"

echo "device_check: $(( $(date +%s) - START )) s in all"
$PY -m benchmarks.device_table "$OUT" | tee "$OUT/table.md"
