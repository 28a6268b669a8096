"""Model drivers (SPEC 3): each model's configuration, block tasks and step-by-step driver."""
