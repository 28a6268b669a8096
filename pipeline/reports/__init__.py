"""What a finished run gives a user: evaluation, exports, plots and summaries, one module per model family."""
