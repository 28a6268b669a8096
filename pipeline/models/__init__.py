"""Model drivers: each model's configuration, block tasks and step-by-step driver."""
