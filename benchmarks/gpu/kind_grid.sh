#!/bin/bash
# One call on a lent GPU for issue 52: the by-kind cells of benchmarks/local_baseline.py (W
# worker processes sharing the GPU) and, beside them, the domain denoiser trained per mechanism
# (benchmarks/bench_kind_attack.py). Carry: .gpu-carry (float16 MiniLM, the data without SST-2's
# GLUE train.tsv, etas.json, personal_spans.json.gz) and .whl (cryptography, cffi, pycparser).
# Everything lands in /tmp/res and comes back as one tarball.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:src:. RAPT_DATA_DIR=$PWD/.gpu-carry/data HF_HUB_OFFLINE=1 \
  PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 RAPT_CACHE=/tmp/rapt-cache TOKENIZERS_PARALLELISM=false
R=/tmp/res; mkdir -p $R/cells $R/kind_attack; nvidia-smi -L > $R/gpu.txt
W=${W:-7}; LIMIT=${LIMIT:-470}; BUDGET=${BUDGET:-95}
C=.gpu-carry
start=$(date +%s)
(timeout $LIMIT python3 -m benchmarks.bench_kind_attack --backbone $C/minilm --etas $C/etas.json \
   --spans $C/personal_spans.json.gz --mechs ${MECHS:-u0.6 r0.6 r0.7} --budget-s $BUDGET \
   --steps ${STEPS:-0} \
   --out $R/kind_attack > $R/kind_attack.log 2>&1) &
for i in $(seq 0 $((W-1))); do
  timeout $LIMIT python3 -m benchmarks.local_baseline remote --etas $C/etas.json \
    --backbone $C/minilm --spans $C/personal_spans.json.gz --out $R/cells --worker $i \
    --workers $W "$@" > $R/w$i.log 2>&1 &
done
(sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv > $R/smi60.txt) &
wait
echo "wall $(( $(date +%s) - start )) s, cells $(ls $R/cells 2>/dev/null | grep -v "\.tmp\." | grep -c "\.npz$")" | tee $R/summary.txt
tail -n 3 $R/w*.log $R/kind_attack.log
tar czf $OUT/kind_grid.tgz -C $R .
