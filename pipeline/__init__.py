"""Engine, model drivers, command line and reports."""
