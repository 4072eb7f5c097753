"""What a run did: step diagnostics, offline probes, curve statistics, metric files (and their
Weights & Biases runs), plots."""

# The submodules (``from jtc.analysis import *`` imports them).
__all__ = [
    'curve_plots',
    'curves',
    'diagnostics',
    'grad_norms',
    'ledger',
    'ledger_view',
    'metric_writer',
    'mismatch',
    'probes',
    'replay',
    'samples',
    'tracking',
]
