#!/usr/bin/env bash
# The GPU measurements of docs/BENCHMARKS.md ("GPU"), each result as JSON (or text) in OUT_DIR:
#
#   bash experiments/gpu_bench.sh OUT_DIR [DATA_DIR] [STEP...]     (DATA_DIR: ../shared/data)
#
# Steps (default: all, in this order), each bounded by `timeout` so that a slow one cannot take
# the rest with it. Together they need more than one 10-minute command (on an H100, `train`
# took 468 s with PyTorch beside it and four cases on 2026-11-24, and `multi30k` 304 s), so on a
# machine lent for 10-minute commands name a few per call:
#   check      gpu_check.py: fused attention (cuDNN), its training on packed rows, the fast
#              path's training, decoding, checkpoints
#   train      the train step at the paper's ~25k target tokens, base and big, on the fast path
#              and on the fast path before 2026-11-24 (einsum attention, loss chunks of 1024,
#              threefry dropout bits, float32 LayerNorm output), with PyTorch beside them when
#              installed (ratio_to_torch)
#   profile    where the base step's time goes (experiments/profile_step.py, slowest ops)
#   sweep      the base step on the fast path with one of its settings taken back at a time
#   flags      the base step on the fast path under each of XLA_VARIANTS (XLA_FLAGS values,
#              one per line; the first is the baseline), one process each, compiled side by
#              side and timed in turn (bench --time-lock): flags_N.json; with BEFORE, the
#              baseline with that package too: flags_before.json
#   decode     greedy and beam 4 at base dims, bf16, batches of 128 on newstest2014 sources
#   multi30k   the multi30k_gpu recipe and a narrow variant side by side (train, then BLEU on
#              val, which chooses, and on test_2016_flickr)
#   auto       the automatic recipe on all of Multi30k, as docs/own-data.md runs it (train
#              without --config, eval on test_2016_flickr, export), alone on the GPU, timed from
#              the files to the export, each compile logged (JAX_LOG_COMPILES), then the eval
#              again in a fresh process (the compilation cache's saving): auto.txt
#   peer       the shipped base and big steps (PEER_CASES) beside the PyTorch peer as its users
#              run it (torch.compile, bf16 autocast, SDPA, fused Adam) and its eager row: peer.json
#   scale      the data path at WMT14 EN-DE size (4.5M synthetic pairs) on this host's cores,
#              with the base recipe's 8-device batches (bench --only scale, on the CPU backend)
#   parity     decoding on this GPU against the CPU, sentence by sentence (backend_parity.py):
#              PARITY_MODEL an exported model, PARITY_CPU its `decode` JSON written on a CPU;
#              greedy and beam 4 at each of PARITY_PRECISIONS (jax's float32 matmul
#              precision: default, and/or highest), each difference explained; parity.tar
#              holds the runs and the reports (both precisions: 260 s on an H100)
#   candidates the base and big steps with the whole batch's loss in one chunk against the
#              shipped path (candidates_a.json), and the same base cases with XLA's Triton
#              GEMMs off for their programs alone (candidates_b.json): two processes compiled
#              side by side and timed in turn, no PyTorch (its torch.compile of base and big
#              took ~3 min on an H100; `train` times it beside the shipped path)
#   loop       bench --only loop: the busy share of a tiny model's run (its steps alone, with a
#              checkpoint and a validation every 1/18 of the steps, with the averaged five
#              checkpoints only), LOOP_ROUNDS rounds (default 3); LOOP_IN_FLIGHT="4 16": each
#              case at each of these depths of the loop's queue of dispatched steps
#   resume     bench --only startup without a model: a resumed `jaxformer train` at base
#              dimensions and 25,600 target tokens a step, to its first step, with the
#              compilation cache and without (RESUME_ROUNDS rounds, default 1)
# BEFORE=DIR also times the train and decode steps with the jaxformer package in DIR (e.g. an
# older commit's: git archive REV jaxformer | tar -x -C DIR). PYTHON: the interpreter (python3).
set -u
out=${1:?usage: gpu_bench.sh OUT_DIR [DATA_DIR] [STEP...]}
data=${2:-../shared/data}
shift $(( $# < 2 ? $# : 2 ))
steps=${*:-check train profile sweep flags decode multi30k scale}
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
path=$root${PYTHONPATH:+:$PYTHONPATH}
before=${BEFORE:-}${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cd "$root"
run() {  # run SECONDS NAME COMMAND...: stdout to OUT/NAME, stderr to the log
  local seconds=$1 name=$2; shift 2
  echo "== $name ($(date -u +%T))" >&2
  timeout "$seconds" "$@" > "$out/$name" || echo "== $name: exit $?" >&2
}
multi30k_run() {  # multi30k_run NAME TRAIN_OPTION...: train, then eval the last 5 averaged
  local name=$1 work m=$data/multi30k; shift
  work=$(mktemp -d)
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.4  # two runs share the GPU
  echo "== multi30k $name ($(date -u +%T))" >&2
  PYTHONPATH=$path timeout 400 "$py" -m jaxformer.cli train "$@" --workdir "$work" \
    --train-src "$m/train.en" --train-tgt "$m/train.de" --eval-src "$m/val.en" \
    --eval-tgt "$m/val.de" ${MULTI30K_SET:-} > "$out/multi30k_$name.txt" 2>&1 \
    || echo "== multi30k $name train: exit $?" >&2
  echo "== multi30k $name: trained at ${SECONDS} s" >&2
  for split in val test_2016_flickr; do
    PYTHONPATH=$path timeout 90 "$py" -m jaxformer.cli eval --workdir "$work" --average-last 5 \
      --src "$m/$split.en" --ref "$m/$split.de" --batch-size 128 --output "$work/$split.hyp" \
      >> "$out/multi30k_$name.txt" 2>&1 || echo "== multi30k $name $split: exit $?" >&2
  done
  echo "== multi30k $name: done at ${SECONDS} s" >&2
}
auto_run() {  # the own-data guide's commands on all of Multi30k, each one timed, alone on the GPU
  local work m=$data/multi30k
  work=$(mktemp -d)
  echo "== auto ($(date -u +%T))" >&2
  {
    PYTHONPATH=$path timeout 420 "$py" -m jaxformer.cli train --workdir "$work/mine" \
      --train-src "$m/train.en" --train-tgt "$m/train.de" --eval-src "$m/val.en" \
      --eval-tgt "$m/val.de" --source-language en --target-language de ${MULTI30K_SET:-} \
      || echo "== auto train: exit $?"
    echo "== auto: trained at ${SECONDS} s"
    PYTHONPATH=$path timeout 90 "$py" -m jaxformer.cli eval --model "$work/mine/average-last5" \
      --src "$m/test_2016_flickr.en" --ref "$m/test_2016_flickr.de" --target-language de \
      || echo "== auto eval: exit $?"
    echo "== auto: evaluated at ${SECONDS} s"
    PYTHONPATH=$path timeout 60 "$py" -m jaxformer.cli export --model "$work/mine/average-last5" \
      "$work/exported" || echo "== auto export: exit $?"
    echo "== auto: exported at ${SECONDS} s"
    cat "$work/mine/recipe.json"
    # The same eval in a fresh process again: what the compilation cache saves.
    PYTHONPATH=$path timeout 90 "$py" -m jaxformer.cli eval --model "$work/mine/average-last5" \
      --src "$m/test_2016_flickr.en" --ref "$m/test_2016_flickr.de" --target-language de \
      || echo "== auto eval again: exit $?"
    echo "== auto: evaluated again at ${SECONDS} s"
  } > "$out/auto.txt" 2>&1
  grep '^== auto' "$out/auto.txt" >&2
}
bench=("$py" experiments/bench --data-dir "$data")
previous=attention=einsum,loss_chunk=1024,dropout_rng=threefry,norm_dtype=float32
variants=${XLA_VARIANTS:-$(printf '%s\n' '' \
  --xla_gpu_enable_triton_gemm=false \
  --xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_FULL_UNROLL \
  --xla_gpu_enable_command_buffer= \
  '--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN,CUSTOM_CALL,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1' \
  '--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_FULL_UNROLL')}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >&2
"$py" -c 'import jax, flax, optax; print("jax", jax.__version__, "flax", flax.__version__,
  "optax", optax.__version__, jax.devices())' >&2
for step in $steps; do
  case $step in
    check) PYTHONPATH=$path run 300 gpu_check.txt "$py" experiments/gpu_check.py ;;
    train) PYTHONPATH=$path run 480 train.json "${bench[@]}" --only train --train-case base \
             --train-case big --execution default --execution "$previous"
           [ -n "${BEFORE:-}" ] && PYTHONPATH=$before run 120 train_before.json "${bench[@]}" \
             --only train --train-case base --no-torch ;;
    profile) PYTHONPATH=$path run 120 profile_base.json "$py" experiments/profile_step.py \
               --preset base --rows 100 --row-len 256 --top 25 ;;
    sweep) PYTHONPATH=$path run 200 sweep.json "${bench[@]}" --only train --train-case base \
             --no-torch --execution default --execution attention=einsum \
             --execution loss_chunk=1024 --execution dropout_rng=threefry \
             --execution norm_dtype=float32 ;;
    flags) lock=$(mktemp) i=0
           [ -n "${BEFORE:-}" ] && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$before \
             run 300 flags_before.json "${bench[@]}" --only train --train-case base --no-torch \
             --time-lock "$lock" &
           while IFS= read -r flags; do  # each process takes its share of the GPU's memory
             XLA_FLAGS=$flags XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$path \
               run 300 "flags_$i.json" "${bench[@]}" --only train --train-case base --no-torch \
               --time-lock "$lock" &
             i=$((i + 1))
           done <<< "$variants"
           wait ;;
    scale) JAX_PLATFORMS=cpu PYTHONPATH=$path run 400 scale.json "${bench[@]}" --only scale ;;
    decode) PYTHONPATH=$path run 120 decode.json "${bench[@]}" --only decode
            [ -n "${BEFORE:-}" ] && PYTHONPATH=$before run 120 decode_before.json "${bench[@]}" \
              --only decode ;;
    multi30k)  # the recipe and its variants side by side on the one GPU, then BLEU on val
      # (the variants are chosen by it) and test_2016_flickr; MULTI30K_SET: more --set options
      SECONDS=0
      multi30k_run recipe --config multi30k_gpu &
      multi30k_run narrow --config multi30k_gpu --set model.d_model=128 --set model.d_ff=256 \
        --set model.dropout_rate=0.2 --set model.warmup_steps=400 &
      wait
      echo "== multi30k: ${SECONDS} s in all" >&2 ;;
    auto) SECONDS=0  # alone on the GPU; JAX_LOG_COMPILES: each program's compile time
      JAX_LOG_COMPILES=1 auto_run
      echo "== auto: ${SECONDS} s in all" >&2 ;;
    peer) PYTHONPATH=$path run 420 peer.json "${bench[@]}" --only train \
            $(printf -- '--train-case %s ' ${PEER_CASES:-base big}) ;;
    parity)
      tmp=$(mktemp -d)
      for precision in ${PARITY_PRECISIONS:-default}; do
        PYTHONPATH=$path timeout 150 "$py" experiments/backend_parity.py decode \
          --model "$PARITY_MODEL" --precision $precision --out "$tmp/gpu-$precision.json" \
          2> /dev/null || echo "== parity decode $precision: exit $?" >&2
        PYTHONPATH=$path timeout 60 "$py" experiments/backend_parity.py compare "$PARITY_CPU" \
          "$tmp/gpu-$precision.json" --model "$PARITY_MODEL" --precision $precision \
          --out "$tmp/report-$precision.json" >&2 || echo "== parity compare: exit $?" >&2
      done
      tar -C "$tmp" -cf "$out/parity.tar" . ;;
    candidates) lock=$(mktemp) chunk=loss_chunk=32768
      XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$path run 420 candidates_a.json \
        "${bench[@]}" --only train --train-case base --train-case big --no-torch \
        --execution default --execution $chunk --time-lock "$lock" &
      XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$path run 420 candidates_b.json \
        "${bench[@]}" --only train --train-case base --no-torch --execution default \
        --execution $chunk --compiler-option xla_gpu_enable_triton_gemm=false \
        --time-lock "$lock" &
      wait ;;
    loop) PYTHONPATH=$path run 300 loop.json "${bench[@]}" --only loop --rounds "${LOOP_ROUNDS:-3}" \
            $(printf -- '--steps-in-flight %s ' ${LOOP_IN_FLIGHT:-}) ;;
    resume) XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$path run 300 resume.json \
              "${bench[@]}" --only startup --rounds "${RESUME_ROUNDS:-1}" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== done ($(date -u +%T))" >&2
