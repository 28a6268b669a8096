"""The main job: ingest a real small corpus, fit Bayesian NMF, report.

The corpus is the Reuters sample shipped in the PyPI package ``lda`` (395 news stories,
LDA-C with a vocabulary). Without that package a generated LDA-shaped corpus stands in,
and the report says so.
"""

from __future__ import annotations

from pathlib import Path

from buffet.data.ingest_text import ingest
from buffet.data.synthetic import write_uci_corpus
from buffet.pipeline.models.bnmf import BNMFConfig
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.messages import logger
from buffet.pipeline.engine.runs import fit_run
from buffet.pipeline.reports.outputs import report_run


def reuters_files() -> tuple[Path, Path] | None:
    """The Reuters LDA-C corpus and vocabulary inside the ``lda`` package, if installed."""
    try:
        import lda
    except ImportError:
        return None
    folder = Path(lda.__file__).parent / "tests"
    corpus, vocab = folder / "reuters.ldac", folder / "reuters.tokens"
    return (corpus, vocab) if corpus.exists() and vocab.exists() else None


def demo_dataset(folder: Path, overwrite: bool) -> Path:
    """Ingest Reuters (or a generated stand-in) with 10% of the documents held out, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "corpus.zarr"
    files = reuters_files()
    if files is not None:
        ingest("ldac", [str(files[0]), str(files[1])], store, holdout=0.1, seed=0, overwrite=overwrite)
    else:
        logger("demo").warning("the package `lda` is not installed: using a generated corpus instead of Reuters")
        docword = folder / "docword.generated.txt"
        write_uci_corpus(docword, n_docs=2000, n_words=2000, n_topics=20, mean_length=150,
                         vocab_path=folder / "vocab.generated.txt")
        ingest("uci", [str(docword), str(folder / "vocab.generated.txt")], store, holdout=0.1, seed=0,
               overwrite=overwrite)
    return store


def run_demo(folder: Path, store: Path, n_topics: int, passes: int, engine: Engine, overwrite: bool = False,
             quiet: bool = False) -> Path:
    """Fit the demo's ``store`` (``demo_dataset``) by SVI with held-out scoring during training, write the
    report folder."""
    config = BNMFConfig(n_topics=n_topics, mode="svi", batch_size=64, passes=passes, eval_every=2,
                        chunk_rows=32, checkpoint_every=10)
    run = fit_run("bnmf", source_of(store), str(folder / "run"), config, engine, overwrite=overwrite, quiet=quiet)
    files = report_run(run, ProcessEngine(), folder / "report")
    print((folder / "report" / "summary.md").read_text())
    print("report files:\n" + "\n".join(f"  {f}" for f in files))
    return folder / "report"
