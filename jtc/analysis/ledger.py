"""The per-token ledger: what an objective does to each token of a rollout batch.

For completion token t of row b the ledger holds the coefficient the objective puts on that
token's score function, c_{b,t} = d loss / d log pi(y_{b,t} | h_{b,t}) (one `jax.grad` with
respect to the per-token log-probs, `diagnostics.loss_coefficients`: the loss's parameter
gradient is exactly sum_{b,t} c_{b,t} grad log pi_{b,t}), and beside it log pi_old, log pi, the
ratio, the advantage and the provenance flags: clipped from below / above (the loss's own clip,
`objectives.loss.clip_flags`), the trajectory gated (A != 0 and every coefficient 0), masked,
truncated, the token weight (DelTA's lambda) and whether the token is shared by the whole group
at the same position (Prop. 3.1's event E_t, `diagnostics.shared_context_mask`).

The trainer writes it every `log.ledger_every` steps (`write`), at two points of the step: the
behaviour policy (before any update: every ratio is 1, the on-policy coefficients) and, when the
step takes more than one update, the parameters before the second one (the first point where the
update is off-policy and the objectives differ). It keeps the parameters before every update of
the step's first epoch, so `python -m jtc.ledger replay` can apply other objectives to the same
frozen rollouts and reproduce the run's logged loss.

On disk, ``<run dir>/ledger/<step>/`` (a population member's run dir for a population):
  ledger.npz   columns [B, T] (b = row, t = completion position) or [B]:
                 completion_BT int32, mask_BT (the tokens that carry gradient), completion_mask_BT,
                 truncated_B, rewards_B, advantages_B, old_logps_BT, sampler_logps_BT,
                 shared_BT, mismatch_BT (log pi_train - log pi_sampler at the behaviour
                 policy), token_weights_BT (token-weighted losses only), ref_logps_BT (runs
                 with a KL term only), is_weights_BT (runs with a mismatch correction only),
                 routing_flip_BT (mixture-of-experts runs only: the token's experts differ
                 between the sampler and the behaviour pass's router in some layer),
                 prompt_BP,
                 prompt_mask_BP, and per point p in POINTS: logps_{p}_BT, coef_{p}_BT,
                 clip_low_{p}_BT, clip_high_{p}_BT, gated_{p}_B
  meta.json    the step, loss name and hyper-parameters, G, P, the learning rate, the update
               schedule (rows of each update), the points written, the vocabulary strings of the
               ids that occur, prompts and completions as text
  model.json, params_update<k>.msgpack   the policy before update k of the step (k = 0: the
               behaviour policy), for replay (absent from a ledger imported without a policy:
               `jtc.interop.ledger_import`, whose meta also has 'source')
Load one with `load(run_dir, step)`; `steps(run_dir)` lists them.

Dimension key (docs/dimensions.md): B rows (groups of G contiguous), T completion length, P prompt width, L = P + T.
"""

import dataclasses
import json
import os

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from jtc import files
from jtc import objectives
from jtc.analysis import diagnostics
from jtc.models import bundles
from jtc.models import model as model_lib

POINTS = ('behaviour', 'offpolicy')  # before any update; before the second update of the step
LEDGER_DIR = 'ledger'
# What every ledger holds (`load` names a file without them as damaged).
COLUMNS = ('completion_BT', 'completion_mask_BT', 'truncated_B', 'rewards_B', 'sampler_logps_BT',
           'prompt_BP', 'prompt_mask_BP', 'mask_BT', 'advantages_B', 'old_logps_BT')
META_KEYS = ('step', 'loss', 'loss_hparams', 'group_size', 'completion_start', 'points', 'updates',
             'vocab')


def token_ledger(logps_BT, *, tokens_BL, input_mask_BL, old_logps_BT, advantages_B, mask_BT,
                 group_size, completion_start, loss_name, loss_hparams, token_weights_BT=None,
                 ref_logps_BT=None, is_weights_BT=None):
  """The ledger columns of one point: {'logps', 'ratio', 'coef', 'clip_low', 'clip_high'
  (all [B, T]), 'gated' [B], 'shared' [B, T]} for the loss ``loss_name`` at log-probs
  ``logps_BT`` (jit-able; everything but the arrays static)."""
  hp = dict(loss_hparams, entropy_coef=0.0)  # the coefficients of the policy-gradient (+ KL) term
  kw = dict(old_logps=old_logps_BT, advantages=advantages_B, mask=mask_BT, group_size=group_size,
            token_weights=token_weights_BT)
  coef_BT, _ = diagnostics.loss_coefficients(logps_BT, loss_name=loss_name, ref_logps=ref_logps_BT,
                                             is_weights=is_weights_BT, **kw, **hp)
  clip_low_BT, clip_high_BT = objectives.loss.clip_flags(loss_name, logps=logps_BT, **kw, **hp)
  real_BT = jnp.asarray(mask_BT) > 0
  live_B = (advantages_B != 0) & jnp.any(real_BT, axis=-1)
  return {
      'logps':
          logps_BT,
      'ratio':
          jnp.where(real_BT, jnp.exp(logps_BT - old_logps_BT), 0.0),
      'coef':
          coef_BT,
      'clip_low':
          clip_low_BT * real_BT,
      'clip_high':
          clip_high_BT * real_BT,
      'gated':
          live_B & jnp.all(coef_BT == 0, axis=-1),
      'shared':
          diagnostics.shared_context_mask(tokens_BL, input_mask_BL, mask_BT, group_size=group_size,
                                          completion_start=completion_start)
  }


@dataclasses.dataclass
class Ledger:
  """One step's ledger: ``columns`` (name -> numpy array, the module docstring's columns) and
  ``meta`` (meta.json), loaded by `load`."""
  columns: dict
  meta: dict
  path: str

  def __getitem__(self, name):
    return self.columns[name]

  @property
  def has_policy(self):
    """Whether the parameters are stored (jtc's runs; an import with --policy.checkpoint)."""
    return os.path.exists(os.path.join(self.path, 'model.json'))

  @property
  def points(self):
    return tuple(self.meta['points'])

  def token_text(self, token_id):
    return self.meta['vocab'].get(str(int(token_id)), f'<{int(token_id)}>')

  def rows(self, point='behaviour'):
    """One dict per real completion token (a table for pandas.DataFrame or a notebook): row,
    group, position, token, and every column of ``point``."""
    c = self.columns
    G = self.meta['group_size']
    out = []
    for b, t in zip(*np.nonzero(c['completion_mask_BT'])):
      out.append({
          'row': int(b),
          'group': int(b) // G,
          'position': int(t),
          'token': self.token_text(c['completion_BT'][b, t]),
          'advantage': float(c['advantages_B'][b]),
          'old_logp': float(c['old_logps_BT'][b, t]),
          'logp': float(c[f'logps_{point}_BT'][b, t]),
          'ratio': float(c[f'ratio_{point}_BT'][b, t]),
          'coef': float(c[f'coef_{point}_BT'][b, t]),
          'clip_low': bool(c[f'clip_low_{point}_BT'][b, t]),
          'clip_high': bool(c[f'clip_high_{point}_BT'][b, t]),
          'gated': bool(c[f'gated_{point}_B'][b]),
          'masked': not c['mask_BT'][b, t],
          'truncated': bool(c['truncated_B'][b]),
          'shared': bool(c['shared_BT'][b, t]),
          'token_weight': float(c['token_weights_BT'][b, t]) if 'token_weights_BT' in c else 1.0
      })
    return out

  def params(self, update=0):
    """The policy's parameters before update ``update`` of the step (0: the behaviour policy)
    and its `ModelConfig`."""
    config = bundles.read_model_config(os.path.join(self.path, 'model.json'))
    template = jax.eval_shape(lambda: model_lib.init_params(config, jax.random.key(0)))
    path = os.path.join(self.path, f'params_update{update}.msgpack')
    if not os.path.exists(path):
      have = sorted(n for n in os.listdir(self.path) if n.startswith('params_'))
      raise FileNotFoundError(
          f'{self.path} has no parameters before update {update}; it has {have}')
    expected = 'the parameters of the model in model.json'
    return config, files.restore_tree(path, template, files.read_msgpack(path, expected=expected),
                                      expected=expected)


def steps(run_dir):
  """The steps of ``run_dir`` that have a ledger, in order."""
  root = os.path.join(run_dir, LEDGER_DIR)
  if not os.path.isdir(root):
    return []
  return sorted(
      int(n)
      for n in os.listdir(root)
      if n.isdigit() and os.path.exists(os.path.join(root, n, 'meta.json')))


def load(run_dir, step):
  """The `Ledger` of ``step`` in ``run_dir`` (a run's workdir or a population member's
  directory); a ValueError naming the steps that have one otherwise."""
  if not os.path.isdir(run_dir):
    raise FileNotFoundError(f'no such run directory {run_dir!r}')
  have = steps(run_dir)
  if step not in have:
    raise ValueError(
        f'{run_dir} has no ledger of step {step}; steps with a ledger: {have or "none"} '
        '(the trainer writes one every config.log.ledger_every steps)')
  path = os.path.join(run_dir, LEDGER_DIR, str(step))
  columns = files.read_npz(os.path.join(path, 'ledger.npz'), keys=COLUMNS,
                           expected='a ledger\'s columns (npz)')
  meta = files.read_json(os.path.join(path, 'meta.json'), keys=META_KEYS,
                         expected='a ledger\'s meta.json')
  return Ledger(columns=columns, meta=meta, path=path)


def write(path, *, columns, meta, model_config, params_by_update):
  """Writes one step's ledger directory (ledger.npz, meta.json, model.json and the parameters
  before each update) atomically: a temporary directory renamed into place."""
  tmp = path + '.tmp'
  os.makedirs(tmp, exist_ok=True)
  np.savez_compressed(os.path.join(tmp, 'ledger.npz'), **{
      k: np.asarray(v) for k, v in columns.items()
  })
  with open(os.path.join(tmp, 'meta.json'), 'w') as f:
    json.dump(meta, f)
  if model_config is not None:  # an imported ledger without a policy has none
    with open(os.path.join(tmp, 'model.json'), 'w') as f:
      json.dump(dataclasses.asdict(model_config), f, indent=1)
  for k, params in params_by_update.items():
    with open(os.path.join(tmp, f'params_update{k}.msgpack'), 'wb') as f:
      f.write(flax.serialization.to_bytes(jax.device_get(params)))
  if os.path.exists(path):  # the same step written again after a resume: same content
    os.replace(path, tmp + '.old')
  os.replace(tmp, path)
  if os.path.exists(tmp + '.old'):
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.rmtree(tmp + '.old')
  return path
