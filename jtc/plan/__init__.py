"""Plan a run before paying for it: every stage of one RL step compiled for a TPU slice without
the hardware (`python -m jtc.plan`)."""

# The submodules (``from jtc.plan import *`` imports them).
__all__ = [
    'estimate',
    'hardware',
    'hlo',
    'lengths',
    'planner',
    'scaling_table',
    'suggest',
    'table',
]
