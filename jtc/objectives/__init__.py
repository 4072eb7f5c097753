"""Intra-group objectives: advantages, in-group weight transforms, per-token surrogates, the loss, DelTA.

The loss entry point is re-exported here: ``from jtc import objectives;
objectives.compute_loss(name, ...)`` (it lives in `jtc.objectives.loss`).
"""
from jtc.objectives.loss import AGGREGATIONS, LOSSES, asym, check_hparams, compute_loss, default_hparams

# The submodules, then the entry points re-exported above.
__all__ = [
    'advantages',
    'corrections',
    'delta',
    'delta_geometry',
    'delta_options',
    'delta_recompute',
    'group_transforms',
    'loss',
    'registry',
    'surrogates',
    'token_weights',
    'AGGREGATIONS',
    'LOSSES',
    'asym',
    'check_hparams',
    'compute_loss',
    'default_hparams',
]
