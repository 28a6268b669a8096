"""Engine, model drivers, command line and reports (SPEC 2)."""
