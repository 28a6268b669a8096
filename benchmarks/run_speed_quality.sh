#!/bin/sh
# The runs behind the speed and quality tables of Bayesian NMF against online LDA.
# Corpus: 50k NYT-shaped documents from 50 LDA topics, 2% (1000 documents) held out.
#   buffet generate --docs 50000 --topics 50 --seed 0 --out $W/nyt50k.txt --vocab $W/vocab50k.txt
#   buffet ingest uci $W/nyt50k.txt $W/vocab50k.txt --out $W/nyt50k.zarr --holdout 0.02 --seed 0
# The host is shared: each run records the CPU load of other processes while it ran
# (foreign_load_cores); pass WAIT= (empty) to wait for a quiet machine before each run.
set -e
W=${W:-bench-data}
PY=${PY:-python}
WAIT=${WAIT---no-wait}
B="$PY $(dirname "$0")/bnmf_vs_lda.py"
S=$W/nyt50k.zarr
speed() {
  # K = 100, minibatch 1000, both cores
  $B buffet  $S --k 100 --batch-size 1000 --workers 2 --chunk-rows 500 --tag speed $WAIT
  $B buffet  $S --k 100 --batch-size 1000 --workers 2 --chunk-rows 500 --tag speed --precision float32 $WAIT
  $B sklearn $S --k 100 --batch-size 1000 --workers 2 --tag speed $WAIT
  $B gensim  $S --k 100 --batch-size 1000 --workers 1 --tag speed $WAIT
  $B gensim  $S --k 100 --batch-size 1000 --workers 0 --tag speed $WAIT
}
quality() {
  # K = 50 (the generating number of topics), one pass
  $B buffet  $S --k 50 --batch-size 1000 --workers 2 --chunk-rows 500 --tag quality $WAIT
  $B buffet  $S --k 50 --batch-size 1000 --workers 2 --chunk-rows 500 --tag quality --precision float32 $WAIT
  $B sklearn $S --k 50 --batch-size 1000 --workers 2 --tag quality $WAIT
  $B gensim  $S --k 50 --batch-size 1000 --workers 1 --tag quality $WAIT
  $B gensim  $S --k 50 --batch-size 1000 --workers 0 --tag quality $WAIT
}
speed
quality
speed
