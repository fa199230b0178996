#!/usr/bin/env bash
# Issue 31 item 4 on the lent GPU, in one device call (benchmarks/gpu/README.md):
#   carry: [".gpu-carry", ".whl"]  (fp16 MiniLM + tokenizer, the data, the wheels)
# Each part has its own wall cap, so a part that fails or runs long leaves time for the rest;
# everything lands in one tarball under $OUT (the device returns at most 8 files).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src:benchmarks RAPT_DATA_DIR=$PWD/.gpu-carry/data HF_HUB_OFFLINE=1 \
  PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
R=/tmp/res; M=.gpu-carry/minilm
mkdir -p $R; nvidia-smi -L > $R/gpu.txt; nvidia-smi >> $R/gpu.txt
part() {  # part NAME SECONDS COMMAND...
  local name=$1 cap=$2; shift 2
  local t0=$SECONDS
  echo "== $name (cap ${cap}s)"
  timeout "$cap" "$@" > "$R/$name.log" 2>&1
  echo "== $name rc=$? in $((SECONDS - t0)) s"; tail -4 "$R/$name.log"
  tar czf /tmp/r.tgz -C "$R" . && mv /tmp/r.tgz "$OUT/issue31_gpu.tgz"  # a cut call returns
}
part cuda_tests 45 python3 -m pytest -q -p no:cacheprovider -x tests/test_nn_search.py \
  tests/test_privatization.py -k cuda
part privatize 100 python3 -m benchmarks.bench_gpu --parts privatize --minilm $M \
  --tokens 131072 --chunk 65536 --repeats 3 --cpu-sample 8192 --out $R/gpu_privatize
part tune 90 python3 -m benchmarks.bench_gpu --parts tune --backbones $M \
  --tune-examples 4096 --out $R/gpu_tune
part mixed 75 python3 -m benchmarks.bench_mixed --device cuda --no-service --backbone $M \
  --threads 8 --out $R/mixed_gpu
part rapt_paper 150 python3 -m benchmarks.bench_rapt --profile paper --device cuda \
  --backbone $M --tasks sst2 --methods prefix --phases main --skip-timing --out $R \
  --name rapt_paper_gpu
cp $R/*.log $OUT/ 2>/dev/null; ls -la $R
