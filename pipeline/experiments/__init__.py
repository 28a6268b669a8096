"""The papers' experiments (SPEC 4), one command each, and the demo."""
