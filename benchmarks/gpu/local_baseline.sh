#!/bin/bash
# One call on a lent GPU: the remote cells of benchmarks/local_baseline.py, W worker processes
# sharing the one GPU (MiniLM at batch 32 leaves an H100 idle between kernel launches; parallel
# workers fill it). Carry: .gpu-carry (float16 MiniLM, the data, etas.json) and .whl
# (cryptography, cffi, pycparser). Every finished cell is an .npz; all come back in one tarball.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:src RAPT_DATA_DIR=$PWD/.gpu-carry/data HF_HUB_OFFLINE=1 \
  PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 RAPT_CACHE=/tmp/rapt-cache TOKENIZERS_PARALLELISM=false
R=/tmp/res; mkdir -p $R/cells; nvidia-smi -L > $R/gpu.txt
W=${W:-8}; LIMIT=${LIMIT:-480}
start=$(date +%s)
for i in $(seq 0 $((W-1))); do
  timeout $LIMIT python3 -m benchmarks.local_baseline remote --etas .gpu-carry/etas.json \
    --backbone .gpu-carry/minilm --out $R/cells --worker $i --workers $W "$@" > $R/w$i.log 2>&1 &
done
(sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv > $R/smi60.txt) &
wait
echo "wall $(( $(date +%s) - start )) s, cells $(ls $R/cells 2>/dev/null | grep -v "\.tmp\." | grep -c "\.npz$")" | tee $R/summary.txt
tail -n 3 $R/w*.log
tar czf $OUT/cells.tgz -C $R .
