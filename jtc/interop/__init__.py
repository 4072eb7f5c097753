"""Other frameworks' rollouts and losses through jtc's instruments: `jtc ledger import` (prime-rl,
slime, verl and a neutral JSONL schema into a per-token ledger) and `jtc conform` (anyone's RL
loss against jtc's per-token coefficients)."""

# The submodules (``from jtc.interop import *`` imports them).
__all__ = [
    'conform',
    'conform_adapters',
    'conform_batches',
    'conform_grad',
    'ledger_import',
    'neutral',
    'plain_losses',
    'prime_rl',
    'rollouts',
    'slime',
    'verl',
]
