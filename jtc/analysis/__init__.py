"""What a run did: step diagnostics, offline probes, curve statistics, metric files, plots."""
