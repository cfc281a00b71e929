#!/usr/bin/env bash
# Back-translation on Multi30k, small enough for 2 CPU cores (docs/BENCHMARKS.md, "Back-
# translation"; the evaluation guide explains the method):
#
#   bash experiments/back_translation.sh OUT_DIR [DATA_DIR] [STAGE...]   (DATA_DIR: ../shared/data/multi30k)
#
# The training pairs are cut in two halves: A (the first 14,500) is the parallel data, B's
# German (the last 14,500) plays the monolingual target-side text. Stages (default: all, in order;
# each skips what an earlier run of it finished):
#   parents    EN->DE and DE->EN, each trained on A with the `multi30k` recipe cut to STEPS
#              updates (default 800 of its 1800: four trainings fit in about an hour and a half on
#              2 CPU cores)
#   synthetic  B's German back-translated into English by the DE->EN model, once by beam search
#              (beam 4) and once by sampling (unrestricted: temperature 1, no top-k or top-p, as in
#              Edunov et al., 2018), seed 1
#   augmented  EN->DE trained the same way on A plus each synthetic set
#   score      test_2016_flickr BLEU of the three EN->DE models (the last 5 checkpoints averaged);
#              each run's wall time is in OUT_DIR/times.tsv
set -euo pipefail
out=${1:?usage: back_translation.sh OUT_DIR [DATA_DIR] [STAGE...]}
data=${2:-../shared/data/multi30k}
shift $(( $# < 2 ? $# : 2 ))
stages=${*:-parents synthetic augmented score}
jaxformer=${JAXFORMER:-.venv/bin/jaxformer}
steps=${STEPS:-800}
mkdir -p "$out"

timed() {  # NAME COMMAND...: runs it, appending "NAME<TAB>seconds" to times.tsv
  local name=$1 start=$SECONDS
  shift
  "$@"
  printf '%s\t%d\n' "$name" $((SECONDS - start)) >> "$out/times.tsv"
}

train() {  # WORKDIR SRC_FILE TGT_FILE SRC_LANG TGT_LANG
  [ -d "$1/average-last5" ] && return 0
  timed "train $(basename "$1")" "$jaxformer" train --config multi30k --workdir "$1" \
    --train-src "$2" --train-tgt "$3" --source-language "$4" --target-language "$5" \
    --eval-src "$data/val.$4" --eval-tgt "$data/val.$5" --num-steps "$steps"
}

head -n 14500 "$data/train.en" > "$out/a.en"
head -n 14500 "$data/train.de" > "$out/a.de"
tail -n 14500 "$data/train.de" > "$out/b.de"

for stage in $stages; do
  case $stage in
    parents)
      train "$out/ende-a" "$out/a.en" "$out/a.de" en de
      train "$out/deen-a" "$out/a.de" "$out/a.en" de en ;;
    synthetic)
      for kind in beam sample; do
        [ -s "$out/b-$kind.en" ] && continue
        flags=(); [ $kind = sample ] && flags=(--sampling --seed 1)
        timed "back-translate $kind" "$jaxformer" translate --model "$out/deen-a/average-last5" \
          --input "$out/b.de" --output "$out/b-$kind.en.tmp" "${flags[@]}"
        mv "$out/b-$kind.en.tmp" "$out/b-$kind.en"
      done ;;
    augmented)
      for kind in beam sample; do
        cat "$out/a.en" "$out/b-$kind.en" > "$out/a+$kind.en"
        cat "$out/a.de" "$out/b.de" > "$out/a+$kind.de"
        train "$out/ende-a+$kind" "$out/a+$kind.en" "$out/a+$kind.de" en de
      done ;;
    score)
      for model in ende-a ende-a+beam ende-a+sample; do
        "$jaxformer" eval --model "$out/$model/average-last5" --src "$data/test_2016_flickr.en" \
          --ref "$data/test_2016_flickr.de" --output "$out/$model.hyps" | tail -n 1 \
          > "$out/$model.bleu.json"
        echo "$model $(cat "$out/$model.bleu.json")"
      done ;;
    *) echo "unknown stage $stage (parents, synthetic, augmented, score)" >&2; exit 2 ;;
  esac
done
