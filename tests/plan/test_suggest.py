"""`jtc.plan.suggest`: overrides set on a copy and printed as the flags that set them again; a
candidate whose failing stage would compile as in a refused one is skipped."""
import os
import types

from absl import flags as absl_flags

from jtc.cli import absl_program
from jtc.cli import train as train_cli
from jtc.objectives import delta_recompute
from jtc.plan import estimate
from jtc.plan import hardware
from jtc.plan import planner
from jtc.plan import suggest
from jtc.rl import sharding

CONFIG = 'configs/real/qwen3_0_6b_gsm8k_dfpo.py'


def test_apply_sets_a_copy_and_the_flags_set_the_same_values():
  c = absl_program.load_config(os.path.join(absl_program.REPO, CONFIG))
  overrides = {'mesh.fsdp': 2, 'optim.microbatch_prompts': 1, 'policy.remat': False}
  before = c.to_dict()
  changed = suggest.apply(c, overrides)
  assert c.to_dict() == before  # the original is left as it is
  assert {k: changed[k.split('.')[0]][k.split('.')[1]] for k in overrides} == overrides
  # Round trip: the printed flags, parsed as the trainer parses them, give the same config.
  argv = ['jtc', f'--config={CONFIG}', *suggest.flags(overrides).split()]
  fv = absl_flags.FlagValues()
  train_cli.define_flags(fv, argv)
  train_cli.parse_flags(argv + ['--workdir=/tmp/unused'], fv)
  assert fv.config.to_dict() == changed.to_dict()


def _setting(fsdp, chunk, score, mb=1, remat=True):
  return {
      'mesh.data': 8 // fsdp,
      'mesh.fsdp': fsdp,
      'mesh.tensor': 1,
      'optim.microbatch_prompts': mb,
      'rollout.chunk_prompts': chunk,
      'rollout.score_chunk_prompts': score,
      'policy.remat': remat
  }


def test_a_failed_stage_is_not_compiled_again_in_the_same_program(monkeypatch):
  chip = hardware.chip_of(hardware.topology_name('v5e-8'))
  order = [
      _setting(8, chunk=8, score=1),  # refused at 'sample'
      _setting(8, chunk=8, score=4, mb=2),  # the same sampler program: skipped
      _setting(4, chunk=8, score=1),  # another mesh: compiled (and over at 'update')
      _setting(4, chunk=8, score=2, mb=1),  # the same update program as the last: skipped
      _setting(4, chunk=8, score=2, mb=2),  # another micro-batch: compiled, fits
  ]
  est = types.SimpleNamespace(peak=1.0, seconds=1.0)
  monkeypatch.setattr(suggest, 'candidates', lambda *a, **k: [(est, o) for o in order])
  compiled = []

  def plan_fn(c, stop_early):
    o = {k: c[k.split('.')[0]][k.split('.')[1]] for k in order[0]}
    compiled.append(o)
    if o['mesh.fsdp'] == 8:
      return planner.Plan('t', chip, 8, {}, [], {}, 'test', 'does not fit: sample', 'sample')
    update_peak = chip.hbm_bytes + 1 if o['optim.microbatch_prompts'] == 1 else 1.0
    rows = [
        types.SimpleNamespace(stage=s, peak=b, calls=1, seconds=1.0, in_total=True)
        for s, b in [('sample', 1.0), ('update', update_peak)]
    ]
    p = planner.Plan('t', chip, 8, {}, rows, {}, 'test')
    assert p.failed_stage == ('update' if not p.fits else '')
    return p

  c = absl_program.load_config(os.path.join(absl_program.REPO, CONFIG))
  best, p = suggest.suggest(c, plan_fn, 8, None, chip, max_compiles=3, log=lambda m: None)
  assert compiled == [order[0], order[2], order[4]] and best == order[4] and p.fits
  # max_compiles counts compiles, not skipped candidates: two compiles end the search.
  compiled.clear()
  assert suggest.suggest(c, plan_fn, 8, None, chip, max_compiles=2,
                         log=lambda m: None) == (None, None)
  assert compiled == [order[0], order[2]]


def test_a_mixture_of_experts_is_also_tried_on_an_expert_axis():
  """A MoE policy planned with mesh.expert = 1: candidates on expert axes that divide its experts
  and the chips, with the all-to-all dispatch, after every candidate without one; a dense policy
  (or one planned with an expert axis) keeps its own."""
  from configs import dfpo_min_replace  # pylint: disable=import-outside-toplevel
  from jtc.models.model_config import ModelConfig  # pylint: disable=import-outside-toplevel
  c = dfpo_min_replace.get_config('smoke')
  tried = lambda c, model: {(o.get('mesh.expert'), o.get('policy.moe_dispatch')) for _, o in suggest
                            .candidates(c, 4, model, hardware.CHIPS['v5e'], fit_only=False)}
  assert tried(c, ModelConfig.tiny_moe()) == {(1, 'replicated'), (2, 'all_to_all'),
                                              (4, 'all_to_all')}
  order = [
      o['mesh.expert'] for _, o in suggest.candidates(c, 4, ModelConfig.tiny_moe(),
                                                      hardware.CHIPS['v5e'], fit_only=False)
  ]
  assert order == sorted(order, key=lambda e: e > 1)  # the expert axes after every other
  assert tried(c, ModelConfig.tiny()) == {(None, None)}
  assert tried(suggest.apply(c, {'mesh.expert': 2}), ModelConfig.tiny_moe()) == {(None, None)}


def test_delta_is_also_tried_with_its_hidden_states_recomputed():
  """A DelTA config's candidates come in both `delta.hidden` modes, each setting held before
  recomputed (the same memory elsewhere, 2K + 2 more forwards); a config without token weights
  has no such key. On Qwen3-8B's DelTA config at the DAPO config's v6e-16 setting the estimate
  of held hidden states is over the chip's 32 GiB (the behaviour pass returns them) and that of
  recomputed ones is under it (docs/scaling.md compares the compiled stages)."""
  from configs import delta  # pylint: disable=import-outside-toplevel
  from jtc.models.model_config import ModelConfig  # pylint: disable=import-outside-toplevel
  c = suggest.apply(delta.get_config('smoke'), {'rollout.prompts_per_step': 2})
  found = suggest.candidates(c, 4, ModelConfig.tiny(), hardware.CHIPS['v5e'], fit_only=False)
  key = lambda o: tuple(v for k, v in sorted(o.items()) if k != 'delta.hidden')
  order = {}
  for i, (_, o) in enumerate(found):
    order.setdefault(key(o), {})[o['delta.hidden']] = i
  assert order and all(m['held'] < m['recomputed'] for m in order.values())
  # A refused held DelTA pass is the same program at any scoring chunk, a recomputing one not.
  program = lambda mode, score: suggest._stage_program(  # pylint: disable=protected-access
      'delta', {
          **found[0][1], 'delta.hidden': mode,
          'rollout.score_chunk_prompts': score
      })
  assert program('held', 1) == program('held', 2) and program('recomputed', 1) != program(
      'recomputed', 2)
  assert all(
      'delta.hidden' not in o
      for _, o in suggest.candidates(suggest.apply(c, {
          'token_weights': '',
          'loss.name': 'grpo'
      }), 4, ModelConfig.tiny(), hardware.CHIPS['v5e'], fit_only=False))
  big = absl_program.load_config(
      os.path.join(absl_program.REPO, 'configs/real/qwen3_8b_math_delta.py'))
  setting = {
      'mesh.data': 1,
      'mesh.fsdp': 16,
      'mesh.tensor': 1,
      'optim.microbatch_prompts': 1,
      'rollout.chunk_prompts': 4,
      'rollout.score_chunk_prompts': 1,
      'policy.remat': True
  }
  v6e = hardware.CHIPS['v6e']
  sizes = sharding.mesh_sizes(data=1, fsdp=16, tensor=1, n_devices=16)
  est = {
      mode: estimate.estimate(config, planner.model_config_for(config, 'tpu'), sizes, v6e)
      for mode in delta_recompute.HIDDEN_MODES
      for config in [suggest.apply(big, {
          **setting, 'delta.hidden': mode
      })]
  }
  assert est['held'].peak > v6e.hbm_bytes >= est['recomputed'].peak
  assert est['recomputed'].seconds > est['held'].seconds
