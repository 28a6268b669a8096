#!/bin/sh
# Bayesian NMF against scikit-learn's and gensim's online LDA, two rounds in one sitting.
# Corpus (LDA-generated, 55,000 documents, V = 8000, ~300 tokens each, 100 topics; 5,000 held out):
#   buffet generate --docs 55000 --seed 0 --out $W/lda55k.txt --vocab $W/vocab55k.txt
#   buffet ingest uci $W/lda55k.txt $W/vocab55k.txt --out $W/lda55k.zarr --holdout 0.0909091 --seed 0
# K = 100, minibatch 1000, one pass, both cores for every system. buffet-cli times the whole `buffet fit bnmf`
# command (start-up included, --eval-every 0) and reads the loop's own time from the run; `buffet` times the
# loop in-process. Every system is scored afterwards by the same document-completion protocol.
set -e
W=${W:-bench-data}
PY=${PY:-python}
TAG=${TAG:-peers}
B="$PY $(dirname "$0")/bnmf_vs_lda.py"
S=$W/lda55k.zarr
round() {
  $B buffet-cli $S --k 100 --batch-size 1000 --workers 2 --tag $TAG "$@"
  $B buffet     $S --k 100 --batch-size 1000 --workers 2 --tag $TAG "$@"
  $B sklearn    $S --k 100 --batch-size 1000 --workers 2 --tag $TAG
  $B gensim     $S --k 100 --batch-size 1000 --workers 0 --tag $TAG
}
round "$@"
round "$@"
