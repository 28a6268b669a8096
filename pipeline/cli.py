"""The ``buffet`` command line (docs/reference/cli.md).

Every failure ends with one line on stderr that says what happened and what to do, and exit status 1
(130 after Ctrl-C; argparse's own usage errors keep its status 2); ``--debug`` shows the traceback
instead. Progress and notices go through the ``buffet`` logger (``engine.messages``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import typing
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np

from buffet.data.arrays import DEFAULT_ROWS_PER_CHUNK
from buffet.data.errors import UserError
from buffet.data.urls import exists, join, normalise, parse_storage_options, set_default_storage_options
from buffet.kernels.bnmf import top_words
from buffet.pipeline.engine.cluster import (CLUSTER_KINDS, DASHBOARD_ADDRESS, WORKER_KINDS, configured_scheduler,
                                            dask_client)
from buffet.pipeline.engine.codec import from_arrays
from buffet.pipeline.engine.dataset import source_of
from buffet.pipeline.engine.engine import Engine
from buffet.pipeline.engine.executor_choice import EXECUTORS, choose, chosen_engine, stored_entries
from buffet.pipeline.engine.lease import DEFAULT_LIFETIME, LIFETIME_VARIABLE, check_free
from buffet.pipeline.engine.messages import StopRequest, console, explain, logger
from buffet.pipeline.engine.process_executor import ProcessEngine
from buffet.pipeline.engine.runs import config_from, fit_run, resume_run, run_source
from buffet.pipeline.engine.runstore import RunStore, write_arrays
from buffet.pipeline.engine.settings import option_help
from buffet.pipeline.registry import MODELS, models, run_experiment, spec_for
from buffet.pipeline.reports.html import write_page
from buffet.pipeline.reports.outputs import evaluate_run, export_run, report_run
from buffet.pipeline.reports.topics import token_shares

FLAG_ALIASES = {"n_topics": ["--k"]}
TOPIC_MODELS = ("bnmf", "cnmf")  # models whose runs hold q(beta) as g, h
INGEST_FORMATS = ("uci", "ldac", "mtx", "ratings", "dense-ratings", "pairs", "table", "h5ad")
# the options of `buffet ingest` passed to the format's function (``data.ingest_text.ingest``) when given
INGEST_OPTIONS = ("holdout", "seed", "rows_per_chunk", "transpose", "sentinel", "kind", "first_column_count",
                  "overwrite", "row_names", "columns", "drop_columns", "missing", "delimiter", "layer", "floor",
                  "ceiling", "min_fold", "min_range", "log", "center", "scale")
FORCE_HELP = ("take the run over even while another buffet command holds it; without this such a run is refused "
              f"(a killed command's hold expires {DEFAULT_LIFETIME:.0f} s, or {LIFETIME_VARIABLE}, after its last "
              "heartbeat)")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    """The Dask cluster options of every command that computes (an embedded LocalCluster unless an existing
    scheduler is named)."""
    p.add_argument("--workers", type=int, default=None,
                   help="number of workers of the LocalCluster the command starts: single-threaded processes, or "
                        "threads of this process with --worker-kind threads (default: one per core)")
    p.add_argument("--worker-kind", choices=WORKER_KINDS, default=None,
                   help="run the LocalCluster's workers as separate processes or as threads of this process; "
                        "threads suit NumPy-heavy tasks that release the GIL (default: the model's choice, "
                        "threads for Bayesian NMF, processes for the others)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="address of a running Dask scheduler (e.g. tcp://host:8786) to use instead of starting a "
                        "LocalCluster; --workers and --worker-kind are then ignored (default: the environment's "
                        "DASK_SCHEDULER_ADDRESS or Dask's scheduler-address setting, if any)")
    p.add_argument("--cluster", choices=CLUSTER_KINDS, default="local",
                   help="local: the embedded LocalCluster, or the cluster --scheduler or DASK_SCHEDULER_ADDRESS names; "
                        "kube: a cluster of --workers pods (default 2) that the Dask Kubernetes operator starts for "
                        "this command and deletes after it, from the image DASK_KUBERNETES__IMAGE names, in the "
                        "current kube context's namespace; needs the package dask-kubernetes (default: "
                        "%(default)s)")
    p.add_argument("--worker-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="stop with a message naming the last checkpoint when the cluster has had no worker for this "
                        "many seconds; a fit that loses some workers goes on with the others (default: "
                        "%(default)s)")
    p.add_argument("--executor", choices=EXECUTORS, default="auto",
                   help="where the work runs: process (in this process, on one core), cluster (the embedded "
                        "LocalCluster or the cluster the options name) or auto: in this process when no cluster is "
                        "named and the data hold at most the model's limit of stored entries (2,000,000 unless the "
                        "model sets another), else on the cluster; the progress line says which and why "
                        "(default: %(default)s)")
    p.add_argument("--quiet", action="store_true",
                   help="print no progress lines and no dashboard address, only the results")


def _default_text(default: object) -> str:
    """How a config field's default reads in ``--help``: on/off for flags, unset for None."""
    if isinstance(default, bool):
        return "on" if default else "off"
    return "unset" if default is None else str(default)


def _config_args(p: argparse.ArgumentParser, config_cls: type) -> None:
    """One option per config field, typed by its default (``--n-topics`` for ``n_topics``), its help the
    field's own (``settings.option``) followed by the default; a field without help is refused."""
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        text = f"{option_help(config_cls, f)} (default: {_default_text(f.default)})".replace("%", "%%")
        kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
        flags = [f"--{f.name.replace('_', '-')}", *FLAG_ALIASES.get(f.name, [])]
        if kind is bool:  # --name / --no-name
            p.add_argument(*flags, dest=f"cfg_{f.name}", action=argparse.BooleanOptionalAction, default=None,
                           help=text)
        else:
            p.add_argument(*flags, dest=f"cfg_{f.name}", metavar=f.name.upper(), type=kind, default=None,
                           help=text)


def _ingest_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="store a data file as a chunked Zarr dataset",
                       description="Check a data file and store it as a chunked Zarr dataset that the models read "
                                   "chunk by chunk; bad input is refused with the file and line.")
    p.add_argument("format", choices=INGEST_FORMATS,
                   help="input format: uci (UCI docword), ldac (LDA-C), mtx (Matrix Market), ratings "
                        "(user,item,rating lines), dense-ratings (a user x item table, the Jester layout), "
                        "pairs (user permission lines, 1-based), table (a CSV/TSV, plain or gzip, or Parquet "
                        "table with a header row of column names and row names in a column) or h5ad (an "
                        "AnnData file's X or a layer)")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="the data file (.gz allowed), then for uci and ldac optionally the vocabulary file, "
                        "one word per line")
    p.add_argument("--out", required=True, metavar="STORE",
                   help="dataset store to create: a folder, or a URL such as s3://bucket/corpus.zarr")
    p.add_argument("--holdout", type=float, default=None, metavar="FRACTION",
                   help="fraction in (0, 1) held out as the split 'heldout' that the models leave out of training "
                        "and score on: whole documents for count data, observed entries otherwise (default: none)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random choice of held-out documents or entries (default: %(default)s)")
    p.add_argument("--rows-per-chunk", type=int, default=None, metavar="ROWS",
                   help="rows per stored chunk, the unit the data are read in; lower it for very wide rows to "
                        f"keep each read small (default: {DEFAULT_ROWS_PER_CHUNK})")
    p.add_argument("--transpose", action="store_true",
                   help="pairs: make the second id of each line the rows (e.g. permissions as rows, as in the "
                        "role-mining experiments); table: store the file's columns as rows (e.g. samples as rows "
                        "of a genes x samples file)")
    p.add_argument("--sentinel", type=float, default=None,
                   help="dense-ratings: the value that marks an unrated entry, NaN allowed (default: 99, as in "
                        "Jester files)")
    p.add_argument("--first-column-count", action="store_true",
                   help="dense-ratings: the first column counts each row's rated items (real Jester files); it "
                        "is checked and dropped")
    p.add_argument("--kind", default=None,
                   help="mtx: store the values as real, binary or counts (default: from the file's field); h5ad: "
                        "real or counts (default: counts when every value is a non-negative whole number and no "
                        "preprocessing option is given)")
    _table_args(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")


def _table_args(p: argparse.ArgumentParser) -> None:
    """The options of ``buffet ingest table`` and ``buffet ingest h5ad``: columns and preprocessing."""
    p.add_argument("--row-names", default=None, metavar="COLUMN",
                   help="table: the column holding the row names, or none for no row names (default: the first "
                        "column when its cells are not numbers)")
    p.add_argument("--columns", action="append", default=None, metavar="PATTERN",
                   help="table: a value column to keep, by name or glob pattern such as 'sample_*'; repeat for "
                        "more (default: every column but the row names)")
    p.add_argument("--drop-columns", action="append", default=None, metavar="PATTERN",
                   help="table: a column to leave out, by name or glob pattern, e.g. 'call*' for the call, "
                        "call.1, ... columns of the Golub expression files; repeat for more")
    p.add_argument("--missing", action="append", default=None, metavar="VALUE",
                   help="table: a cell text that marks a missing value, besides empty, NA and NaN cells (a "
                        "number also matches cells equal to it, e.g. -999 matches -999.0); repeat for more; "
                        "missing cells are stored masked")
    p.add_argument("--delimiter", default=None, metavar="CHAR",
                   help="table: the delimiter of a text table, one character or tab, comma, semicolon, space "
                        "(default: from the extension, comma for .csv, tab for .tsv, .tab and .txt)")
    p.add_argument("--layer", default=None, metavar="NAME", help="h5ad: ingest this layer instead of X")
    p.add_argument("--floor", type=float, default=None, metavar="VALUE",
                   help="table, h5ad: raise values below VALUE to VALUE (preprocessing step 1 of 7)")
    p.add_argument("--ceiling", type=float, default=None, metavar="VALUE",
                   help="table, h5ad: lower values above VALUE to VALUE (step 2)")
    p.add_argument("--min-fold", type=float, default=None, metavar="VALUE",
                   help="table, h5ad: keep only the rows whose max/min is above VALUE (step 3)")
    p.add_argument("--min-range", type=float, default=None, metavar="VALUE",
                   help="table, h5ad: keep only the rows whose max - min is above VALUE (step 4)")
    p.add_argument("--log", choices=("2", "10", "e"), default=None,
                   help="table, h5ad: take logarithms to this base (step 5)")
    p.add_argument("--center", choices=("rows", "columns"), default=None,
                   help="table, h5ad: subtract each row's or each column's mean (step 6)")
    p.add_argument("--scale", choices=("rows", "columns"), default=None,
                   help="table, h5ad: divide each row or each column by its standard deviation (step 7); the "
                        "steps run in this order and are recorded in the store's provenance")


def _fit_parser(sub: argparse._SubParsersAction, model: str | None = None) -> None:
    """``buffet fit MODEL``: a subcommand per model, or for ``model`` alone (``build_parser``)."""
    p = sub.add_parser("fit", help="fit a model to a dataset store",
                       description="Fit a model to a dataset store into a new run folder, with checkpoints. "
                                   "`buffet fit MODEL --help` lists the model's options.")
    model_parsers = p.add_subparsers(dest="model", required=True, metavar="MODEL",
                                     help="the model to fit, one of:")
    for name, spec in sorted((models() if model is None else {model: spec_for(model)}).items()):
        m = model_parsers.add_parser(name, help=spec.summary, description=spec.summary[:1].upper() + spec.summary[1:])
        m.add_argument("store", help="dataset store to fit, made by `buffet ingest` (a folder or a URL)")
        m.add_argument("--out", required=True, metavar="RUN",
                       help="run folder to create for the parameters, checkpoints and trace (a folder or a URL)")
        m.add_argument("--overwrite", action="store_true", help="replace an existing run folder at --out")
        m.add_argument("--force", action="store_true", help=FORCE_HELP)
        m.add_argument("--stop-after", type=int, default=None, metavar="STEPS",
                       help="stop after this many steps (rows for the particle filters, sweeps for the samplers), "
                            "leaving a run that `buffet resume` continues (default: run to the end)")
        _config_args(m, spec.config_cls)
        _cluster_args(m)


def _run_parsers(sub: argparse._SubParsersAction) -> None:
    """The commands that act on a run folder."""
    p = sub.add_parser("resume", help="continue an interrupted run from its last checkpoint")
    p.add_argument("run", help="run folder of an interrupted `buffet fit`; a finished run is left as it is")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    _cluster_args(p)

    p = sub.add_parser("evaluate", help="held-out metrics of a run")
    p.add_argument("run", help="run folder to score on its dataset's held-out split")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object instead of lines")
    _cluster_args(p)

    p = sub.add_parser("export", help="write fitted global parameters and the trace to .npz")
    p.add_argument("run", help="run folder whose fitted parameters to export")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the .npz file to write (one array per parameter and per traced quantity; a path or a URL)")

    p = sub.add_parser("report", help="PNG plots and a summary of a run, and with --html one page of both")
    p.add_argument("run", help="run folder to plot and summarise, of any model")
    p.add_argument("--out", required=True, metavar="FOLDER",
                   help="folder for the PNG plots and summary.md, created if missing")
    p.add_argument("--html", action="store_true",
                   help="also write report.html there: the plots, summary and the run's configuration on one "
                        "self-contained page (images embedded, no network needed to view it)")


def _job_parsers(sub: argparse._SubParsersAction) -> None:
    """The self-contained jobs: the demo, the papers' experiments and the corpus generator."""
    p = sub.add_parser("demo", help="the main job: ingest a real corpus, fit Bayesian NMF, report")
    p.add_argument("--out", default="buffet-demo",
                   help="folder for the dataset, run and report (default: %(default)s)")
    p.add_argument("--k", type=int, default=20,
                   help="number of topics to fit to the Reuters sample, or to the generated corpus that stands in "
                        "for it without the package lda (default: %(default)s)")
    p.add_argument("--passes", type=int, default=3,
                   help="SVI passes over the corpus; more fit better and take longer (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the dataset and run that an earlier demo left in --out")
    _cluster_args(p)

    p = sub.add_parser("reproduce", help="run one of the papers' experiments (tables and PNG figures)")
    p.add_argument("name", help="experiment name, e.g. ibp-evidence, role-mining, collaborative-filtering; an "
                                "unknown name lists the available ones")
    p.add_argument("--out", default=None, metavar="FOLDER",
                   help="folder for the experiment's tables, figures and working files (default: reproduce-NAME)")
    p.add_argument("--seeds", type=int, default=None,
                   help="repeats (seeds or random splits) averaged in the tables; fewer run faster "
                        "(default: 10, and 3 for bmf-genes, whose 3 splits take about 10 minutes on 2 cores)")
    p.add_argument("--quick", action="store_true",
                   help="a small, fast version for smoke tests; its numbers are not the papers'")
    p.add_argument("--jester", default=None, metavar="FILE",
                   help="collaborative-filtering: run on this Jester ratings file (count column, then one column "
                        "per joke, 99 = unrated) instead of the MovieLens sample")

    p = sub.add_parser("generate", help="write a synthetic LDA-shaped corpus as a UCI docword file")
    p.add_argument("--docs", type=int, required=True, help="number of documents (rows) to write")
    p.add_argument("--words", type=int, default=8000,
                   help="vocabulary size V, the number of columns (default: %(default)s, as the NYT corpus)")
    p.add_argument("--topics", type=int, default=100,
                   help="number of true topics the documents mix (default: %(default)s)")
    p.add_argument("--length", type=float, default=300.0,
                   help="mean number of tokens per document (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the generated topics and documents (default: %(default)s)")
    p.add_argument("--out", required=True, help="docword file to write (.txt, or .txt.gz to compress)")
    p.add_argument("--vocab", default=None, metavar="FILE",
                   help="also write a vocabulary file (word0, word1, ...) here, for `buffet ingest uci`")


def build_parser(fit_model: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="buffet", description="Bayesian matrix factorization on Dask")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of a failure instead of its one-line explanation "
                             "(may be given anywhere on the command line)")
    parser.add_argument("--storage-options", metavar="JSON",
                        help="options for the filesystem of s3://, gs://, abfs:// stores and runs, as a JSON object "
                             "passed to fsspec, e.g. '{\"anon\": true}' or '{\"client_kwargs\": {\"endpoint_url\": "
                             "\"http://127.0.0.1:9000\"}}'; workers the command starts get them too (default: the "
                             "filesystem's own environment, e.g. the AWS_* variables; may be given anywhere)")
    parser.add_argument("--dashboard-address", metavar="ADDR", default=DASHBOARD_ADDRESS,
                        help="host:port of the Dask dashboard of the LocalCluster a command starts, e.g. "
                             "0.0.0.0:8787 to reach it from other machines (default: %(default)s, this machine "
                             "only, a free port; may be given anywhere)")
    sub = parser.add_subparsers(dest="command", required=True, help="what to do; `buffet COMMAND --help` says more")
    _ingest_parser(sub)
    p = sub.add_parser("info", help="describe a dataset store")
    p.add_argument("store", help="dataset store to describe as JSON: shape, kind, chunks, splits, provenance")
    p.add_argument("--verify", action="store_true",
                   help="also read every chunk of every array and check it against the store's chunk records "
                        "(e.g. after copying or uploading a store); a missing or damaged chunk is an error")
    _fit_parser(sub, fit_model)
    _run_parsers(sub)
    _job_parsers(sub)
    return parser


def cluster_named(args: argparse.Namespace) -> str | None:
    """The option or setting of a command that names a cluster to run on, if any (``executor_choice``)."""
    if args.scheduler:
        return "--scheduler"
    if args.cluster == "kube":
        return "--cluster kube"
    if configured_scheduler():
        return "DASK_SCHEDULER_ADDRESS"
    if args.workers is not None:
        return "--workers"
    return "--worker-kind" if args.worker_kind else None


def engine_for(args: argparse.Namespace, model: str, data: Callable[[], Any] | None = None) -> ContextManager[Engine]:
    """The engine a command runs ``model`` on: in this process or on a cluster (``executor_choice``; ``data()``
    opens the job's data to measure it); the LocalCluster's worker kind defaults to ``model``'s. The progress
    line names the executor and why once it is ready."""
    spec = spec_for(model)
    choice = choose(args.executor, cluster_named(args), lambda: None if data is None else stored_entries(data()),
                    spec.process_entries)

    def announce(where: str) -> None:
        if not args.quiet:
            logger("engine").info("executor: %s (%s)", where, choice.reason)

    def cluster() -> ContextManager[Any]:
        return dask_client(args.workers, args.scheduler, quiet=args.quiet,
                           worker_kind=args.worker_kind or spec.worker_kind, cluster=args.cluster,
                           dashboard_address=args.dashboard_address)

    return chosen_engine(choice, cluster, args.worker_timeout, announce)


def config_from_args(args: argparse.Namespace):
    """The config of ``buffet fit MODEL`` with these options, checked (its fields not given keep their defaults)."""
    spec = spec_for(args.model)
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    config = config_from(spec, given)
    config.check()
    return config


def cmd_fit(args: argparse.Namespace) -> None:
    config = config_from_args(args)
    source = source_of(args.store)
    source.open()  # a missing or corrupt store fails here, before a cluster starts
    RunStore.check_new(args.out, args.overwrite)
    check_free(args.out, args.force)
    with engine_for(args, args.model, source.open) as engine:
        run = fit_run(args.model, source, args.out, config, engine, args.overwrite, args.stop_after, args.quiet,
                      args.force)
    print(f"run {run.path}: {run.status}")
    _print_topics(run)


def _print_topics(run: RunStore) -> None:
    """The top words of the 20 topics of a topic model's run that hold the most tokens, with their shares."""
    if run.model not in TOPIC_MODELS or not run.has_checkpoint():
        return
    # not the driver: that would read the whole corpus; and of the globals, q(beta)'s shapes and rates only
    arrays = from_arrays(run.read_checkpoint().globals, fields=("g", "h"))
    g, h = arrays["g"], arrays["h"]
    share = token_shares(g, config_from(spec_for(run.model), run.params).hyper(g.shape[0]).c0)
    words = top_words(g, h, run_source(run).open().column_names())
    for k in np.argsort(-share, kind="stable")[:20]:
        print(f"topic {k:3d} ({share[k]:5.1%}): {' '.join(words[k])}")


def cmd_resume(args: argparse.Namespace) -> None:
    stored = RunStore(args.run)
    check_free(args.run, args.force)
    with engine_for(args, stored.model, run_source(stored).open) as engine:
        run = resume_run(args.run, engine, args.quiet, args.force)
    print(f"run {run.path}: {run.status}")


def cmd_evaluate(args: argparse.Namespace) -> None:
    run = RunStore(args.run)
    with engine_for(args, run.model, run_source(run).open) as engine:
        result = evaluate_run(run, engine)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


def cmd_export(args: argparse.Namespace) -> None:
    arrays = export_run(RunStore(args.run), ProcessEngine())
    out = normalise(args.out)
    write_arrays(out, arrays)
    print(f"wrote {out} ({', '.join(sorted(arrays))})")


def cmd_report(args: argparse.Namespace) -> None:
    run = RunStore(args.run)
    files = report_run(run, ProcessEngine(), Path(args.out))
    if args.html:
        files.append(write_page(run, files, Path(args.out) / "report.html"))
    print("\n".join(str(f) for f in files))


def cmd_info(args: argparse.Namespace) -> None:
    from buffet.data.store import Dataset

    ds = Dataset(args.store)
    description = ds.describe()
    if args.verify:
        description["verified_chunks"] = ds.verify()
    print(json.dumps(description, indent=1))


def cmd_ingest(args: argparse.Namespace) -> None:
    from buffet.data.ingest_text import ingest

    options = {name: getattr(args, name) for name in INGEST_OPTIONS}
    ds = ingest(args.format, args.sources, args.out, **options)
    print(json.dumps(ds.describe(), indent=1))


def cmd_demo(args: argparse.Namespace) -> None:
    from buffet.pipeline.experiments.demo import demo_dataset, run_demo

    store = demo_dataset(Path(args.out), args.overwrite)
    with engine_for(args, "bnmf", source_of(store).open) as engine:
        run_demo(Path(args.out), store, args.k, args.passes, engine, args.overwrite, args.quiet)


def cmd_reproduce(args: argparse.Namespace) -> None:
    files = run_experiment(args.name, Path(args.out or f"reproduce-{args.name}"), args.seeds, args.quick,
                           {"jester": Path(args.jester) if args.jester else None})
    print("\n".join(str(f) for f in files))


def cmd_generate(args: argparse.Namespace) -> None:
    from buffet.data.synthetic import write_uci_corpus

    info = write_uci_corpus(args.out, args.docs, args.words, args.topics, args.length, seed=args.seed,
                            vocab_path=args.vocab)
    print(json.dumps(info))


COMMANDS = {"fit": cmd_fit, "resume": cmd_resume, "evaluate": cmd_evaluate, "export": cmd_export,
            "report": cmd_report, "info": cmd_info, "ingest": cmd_ingest, "demo": cmd_demo,
            "generate": cmd_generate, "reproduce": cmd_reproduce}


def resume_hint(args: argparse.Namespace) -> str | None:
    """How to continue the run a fit, resume or demo command was writing, or None (nothing to resume)."""
    path = {"fit": getattr(args, "out", None), "resume": getattr(args, "run", None)}.get(args.command)
    if args.command == "demo":
        path = str(Path(args.out) / "run")
    try:
        if path is None or not exists(join(normalise(path), "run.json")):
            return None
        run = RunStore(path)
        step = run.newest_step()
    except (UserError, OSError):
        return None
    if run.status == "finished":
        return None
    if step is not None:
        return f"the run is checkpointed at step {step}: `buffet resume {path}` continues it"
    return f"the run has no checkpoint yet: `buffet resume {path}` starts it again"


def pop_option(argv: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of option ``name`` given anywhere in ``argv`` (``NAME VALUE`` or ``NAME=VALUE``), and the
    other arguments; a name without a value is left for argparse to refuse."""
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg[len(name) + 1:], argv[:i] + argv[i + 1:]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
    return None, argv


def _fit_model(argv: list[str]) -> str | None:
    """The model of a ``buffet fit MODEL ...`` command line that names a known model, so that the parser, and
    the process, need only that model's module (``registry.spec_for``); None for any other command line
    (``buffet fit --help`` lists every model)."""
    if len(argv) > 1 and argv[0] == "fit" and argv[1] in MODELS:
        return argv[1]
    return None


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, str | None]:
    """The parsed command line (without --debug, which ``main`` reads) and its --storage-options JSON (or
    None); the global options --storage-options and --dashboard-address may be given anywhere."""
    options, argv = pop_option([a for a in argv if a != "--debug"], "--storage-options")
    dashboard, argv = pop_option(argv, "--dashboard-address")
    args = build_parser(_fit_model(argv)).parse_args(argv)
    if dashboard is not None:
        args.dashboard_address = dashboard
    return args, options


def stop_signals() -> list[int]:
    """The signals that stop a command (``messages.StopRequest``): SIGTERM, and Ctrl-C's SIGINT unless this
    process was started with it ignored (a background job of a non-interactive shell, ``nohup``)."""
    return [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler
                               else [])


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit status. A failure, Ctrl-C or SIGTERM (a job scheduler ending the job)
    is one line on stderr (``messages.explain``; the traceback only with ``--debug``), and a fit it stops is
    left interrupted, with its checkpoints, for ``buffet resume``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args, options = parse_args(argv)
    handler = console(logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    if not debug:  # asyncio's notes on tasks a Ctrl-C or a lost cluster cut short are not the user's business
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, StopRequest.on_signal) for sig in stop_signals()} if on_main_thread else {}
    unraisable_hook = sys.unraisablehook
    if not debug:
        sys.unraisablehook = StopRequest.unraisable
    try:
        if options is not None:
            set_default_storage_options(parse_storage_options(options))
        COMMANDS[args.command](args)
    except (Exception, KeyboardInterrupt) as exc:
        if debug:
            raise
        line, status = explain(exc, resume_hint(args))
        print(f"buffet: {'' if status in (130, 143) else 'error: '}{line}", file=sys.stderr)
        return status
    finally:
        logging.getLogger("buffet").removeHandler(handler)
        for sig, earlier in previous.items():
            signal.signal(sig, earlier)
        sys.unraisablehook = unraisable_hook
        StopRequest.forget()
    return 0


def run() -> None:
    """The ``buffet`` command: ``main``, then the process ends at once with its status. Everything the
    command writes is complete by then, so the interpreter's own teardown (freeing a thousand modules'
    objects: 0.76-1.15 s after a fit on a loaded host) is skipped; output and logs are flushed first."""
    status = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a reader that went away (``buffet ... | head``) is not an error
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    run()
