"""The papers' experiments, one command each, and the demo."""
