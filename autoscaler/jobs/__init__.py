"""The job's domain: its spec, states and outcomes, scaling model, workdir archive, summary, output cap."""
