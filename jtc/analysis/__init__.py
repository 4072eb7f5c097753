"""What a run did: step diagnostics, offline probes, curve statistics, metric files (and their
Weights & Biases runs), plots."""

# The submodules (``from jtc.analysis import *`` imports them).
__all__ = [
    'coupling',
    'credit_step',
    'curve_plots',
    'curves',
    'diagnostics',
    'flipping',
    'grad_norms',
    'gradient_mass',
    'ledger',
    'ledger_view',
    'metric_writer',
    'mismatch',
    'mismatch_lag',
    'probes',
    'replay',
    'samples',
    'tracking',
]
