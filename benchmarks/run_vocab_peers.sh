#!/bin/sh
# Bayesian NMF, scikit-learn's online LDA and gensim's LdaModel as the vocabulary grows: one pass over the same
# 30,000 training documents at V = 8000, 25,000, 50,000 and 100,000, the systems alternated at each V.
# The V = 8000 corpus is LDA-generated (`buffet generate`, ~300 tokens per document, 100 topics); the wider
# ones move a tenth of its nonzeros to a Zipf-ranked tail of rare words (long_tail_corpus.py), so every
# corpus has the same documents' lengths and the same 500 held-out documents, and a minibatch touches a
# part of the vocabulary, as real text's do. K = 100, minibatch 1000, both cores for buffet and
# scikit-learn (gensim's LdaModel has one thread). Every system is scored by the same document completion.
#
#   W=bench-data PY=.venv/bin/python sh benchmarks/run_vocab_peers.sh
#   python benchmarks/summarise.py benchmarks/results/vocab_peers.jsonl   # a line per run
set -e
W=${W:-bench-data}
PY=${PY:-python}
HERE=$(dirname "$0")
BUFFET="$(dirname "$PY")/buffet"
RESULTS=${RESULTS:-$HERE/results/vocab_peers.jsonl}
mkdir -p "$W"
if [ ! -d "$W/vocab8000.zarr" ]; then
  $BUFFET generate --docs 30500 --words 8000 --seed 1 --out "$W/vocab8000.txt"
  $BUFFET ingest uci "$W/vocab8000.txt" --out "$W/vocab8000.zarr" --holdout 0.016393 --seed 0
fi
for V in 25000 50000 100000; do
  if [ ! -d "$W/vocab$V.zarr" ]; then
    $PY "$HERE/long_tail_corpus.py" "$W/vocab8000.zarr" --words $V --out "$W/vocab$V.txt"
    $BUFFET ingest uci "$W/vocab$V.txt" --out "$W/vocab$V.zarr" --holdout 0.016393 --seed 0
  fi
done
B="$PY $HERE/bnmf_vs_lda.py"
for V in 8000 25000 50000 100000; do
  S=$W/vocab$V.zarr
  $B buffet  "$S" --k 100 --batch-size 1000 --workers 2 --tag vocab --results "$RESULTS" "$@"
  $B sklearn "$S" --k 100 --batch-size 1000 --workers 2 --tag vocab --results "$RESULTS" "$@"
  $B gensim  "$S" --k 100 --batch-size 1000 --workers 0 --tag vocab --results "$RESULTS" "$@"
done
