"""jaxformer's benchmarks: one module per section, shared helpers in common; run the package
(python experiments/bench) for the whole report as JSON."""
