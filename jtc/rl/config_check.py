"""The trainer config checked as a whole before any compute: `validate(config)`.

Each section is checked by the module that consumes it (`checkpoints.check_policy_config`,
`data.check_config`, `rollout.check_config`, `update.check_config`, ...); this module only calls
them in turn and checks what spans sections (a token-weighted loss needs a token-weight plug-in).
"""

import sys

from jtc.analysis import tracking
from jtc.models import lora
from jtc.objectives import advantages as advantages_lib
from jtc.rl import checkpoints
from jtc.rl import distributed
from jtc import checks
from jtc.data import pipeline as data_lib
from jtc import objectives
from jtc.data import rewards as rewards_lib
from jtc.data import verifiers
from jtc.rl import population as population_lib
from jtc.rl import minibatch_order
from jtc.rl import rollout as rollout_lib
from jtc.rl import routing
from jtc.rl import sharding as sharding_lib
from jtc.objectives import registry
from jtc.data import tasks as tasks_lib
from jtc.objectives import token_weights
from jtc.rl import update as update_lib


def validate(c):
  """Raises ValueError naming the offending key for any invalid setting, before any compute;
  each section is checked by the module that consumes it, and a population's members are each
  checked as the single run they equal (so a varied value is checked like a set one)."""
  lora.check_config(c.lora)
  population_lib.check_config(c)
  # The W&B keys (the run's, not a member's); only process 0 logs, so only it needs W&B.
  tracking.check_config(c.log, primary=distributed.is_primary())
  members = population_lib.members(c)
  if len(members) > 1 or members[0].values:
    if c.token_budget:
      raise ValueError(f'config.token_budget={c.token_budget} needs a single run '
                       '(config.population.size=1, no population.vary): a population steps its '
                       'members together, and they generate different numbers of tokens')
    for member in members:
      try:
        _validate_run(population_lib.member_config(c, member))
      except ValueError as e:
        raise ValueError(f'population member {member.name}: {e}') from None
  else:
    _validate_run(c)
  sharding_lib.check_batch_rows(
      update_lib.microbatch_prompts(c.optim) * c.rollout.sampling.num_samples,
      sharding_lib.mesh_sizes(**c.mesh))
  if c.data.dataset and not c.policy.checkpoint:
    print(
        f'note: config.data.dataset with the jtc policy {c.policy.init!r}: the shipped base '
        'policy never writes \\boxed{}, so expect every reward to be 0', file=sys.stderr)


def validate_policy(c, model_config, population_size=1):
  """The keys that depend on the loaded policy, once it is known (still before any compute):
  LoRA's rank against its dimensions, a mixture of experts' keys (`jtc.rl.routing`)."""
  lora.check_config(c.lora, model_config)
  routing.check_config(c, model_config, population_size)


def _validate_run(c):
  """Every section of a single run's config but the mesh (the population's)."""
  checkpoints.check_policy_config(c.policy)
  data_lib.check_config(c.data, tasks=tasks_lib.TASKS, reward_fns=rewards_lib.reward_names())
  verifiers.check_config(c.data)
  checks.positive_int('config.num_steps', c.num_steps)
  checks.choice('config.advantage.name', c.advantage.name, advantages_lib.ADVANTAGES)
  checks.choice('config.advantage.sign', c.advantage.sign, advantages_lib.SIGNS)
  if c.advantage.sign != 'both' and c.token_weights:
    raise ValueError(f'config.advantage.sign={c.advantage.sign!r} with config.token_weights='
                     f"{c.token_weights!r}: DelTA's token classes need both signs; use 'both'")
  checks.choice('config.loss.name', c.loss.name, objectives.LOSSES)
  objectives.check_hparams(c.loss.name, c.loss.hparams.to_dict())
  if objectives.LOSSES[c.loss.name].token_weighted != bool(c.token_weights):
    raise ValueError(f'config.loss.name={c.loss.name!r} with config.token_weights='
                     f'{c.token_weights!r}: losses {registry.token_weighted()} need a token-weight '
                     f'plug-in ({sorted(token_weights.PLUGINS)}), the others none')
  if c.token_weights:
    checks.choice('config.token_weights', c.token_weights, token_weights.PLUGINS)
    token_weights.PLUGINS[c.token_weights].check_config(c.delta)
  rollout_lib.check_config(c)
  update_lib.check_config(c.optim, c.rollout.prompts_per_step)
  minibatch_order.check_config(c)
  checks.choice('config.log.diagnostics_mode', c.log.diagnostics_mode, ('proxy', 'exact'))
  checks.in_range('config.log.diagnostics_every', c.log.diagnostics_every, low=0, integer=True)
  checks.in_range('config.log.ledger_every', c.log.ledger_every, low=0, integer=True)
  checks.positive_int('config.log.ckpt_every', c.log.ckpt_every)
  checks.positive_int('config.log.keep_checkpoints', c.log.keep_checkpoints)
