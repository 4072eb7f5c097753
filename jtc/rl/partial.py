"""Partial rollouts (`config.rollout.max_decode_steps`): an RL step does not wait for its longest
answers; and the checks of the rollout's decoding settings (scheduler, slots, layout).

With K = max_decode_steps, a sampler call of the continuous scheduler stops after K decode steps
(`sampler.sample(max_decode_steps=K)`): its rows not ended then are unfinished. Each member keeps
a pool of IN_FLIGHT x prompts_per_step groups (G samples of a prompt) in flight: an RL step tops
it up with new batches of the prompt stream and runs rounds, each continuing every unfinished
row for at most K decode steps under that step's parameters, until prompts_per_step groups are
complete (all G rows ended: EOS or T tokens). The step trains on those groups, the earliest
started first; the others stay in the pool and are continued by the next steps, under newer
parameters. So a step waits for enough answers, not for the longest ones; the pool (and a
checkpoint) holds the rest.

A continued row is re-prefilled: its prompt and its tokens so far, as one prompt, run once
through the newer policy, whose decode steps then draw its next tokens (`continue_rows`). Not
its cache kept: (1) every token is then drawn from exactly the policy that its version names (a
kept cache holds the keys / values the older policy computed for the earlier tokens: the next
tokens' distribution would be neither policy's), (2) no KV cache is held across the update (its
memory is the update's), (3) a checkpoint holds the rows' tokens only, and a resumed run continues
them exactly. The cost is one prefill of P + t tokens per continued row and round.

Per token the pool keeps the version of the policy that drew it (`versions_BT`: the RL step whose
parameters sampled it, minus config.rollout.policy_lag) and its log-prob under that policy (the
sampler's, `sampler_logps_BT`): the update's ratios take these per-token behaviour log-probs
(config.rollout.behaviour_logps='sampler'); a recomputed behaviour pass has no single policy for
such a row.

Dimension key (docs/dimensions.md): N groups in flight, G samples per prompt, T max new tokens,
B rows, P prompt width, L = P + T.
"""

import base64
import dataclasses
import io

import numpy as np

from jtc import checks
from jtc.models import decode_loop
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib

NO_VERSION = -1  # versions_BT where there is no token
# Groups in flight per prompts_per_step: a step trains on the first half to complete and carries
# the rest (with exactly prompts_per_step in flight a step would wait for all of them).
IN_FLIGHT = 2


def check_config(c):
  """config.rollout's decoding settings: scheduler, decode_slots (1 <= slots <= the rows of one
  sampler call, continuous only), decode_layout, max_decode_steps (continuous only, with the
  sampler's per-token behaviour log-probs and nothing that needs a whole-sequence recompute)."""
  r = c.rollout
  checks.choice('config.rollout.scheduler', r.scheduler, decode_loop.SCHEDULERS)
  checks.choice('config.rollout.decode_layout', r.decode_layout, sharding_lib.DECODE_LAYOUTS)
  rows = (r.chunk_prompts or r.prompts_per_step) * r.sampling.num_samples
  continuous = "config.rollout.scheduler='continuous'"
  if r.decode_slots is not None:
    if r.scheduler != 'continuous':
      raise ValueError(f'config.rollout.decode_slots={r.decode_slots} needs {continuous} (the '
                       'static scheduler runs every row)')
    slots = r.decode_slots
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= rows:
      raise ValueError(f'config.rollout.decode_slots={slots!r} must be an int in [1, {rows}] (the '
                       'rows of one sampler call: chunk_prompts or prompts_per_step x num_samples)')
  checks.in_range('config.rollout.max_decode_steps', r.max_decode_steps, low=0, integer=True)
  if r.max_decode_steps:
    _check_partial(c, continuous)


def _check_partial(c, continuous):
  r, key = c.rollout, f'config.rollout.max_decode_steps={c.rollout.max_decode_steps}'
  if r.scheduler != 'continuous':
    raise ValueError(f'{key} (partial rollouts) needs {continuous}: the static scheduler decodes '
                     'a call\'s rows side by side and has no rows to carry')
  if r.behaviour_logps != 'sampler':
    raise ValueError(f"{key} needs config.rollout.behaviour_logps='sampler': a row continued "
                     'under a newer policy has no single policy to recompute its behaviour '
                     'log-probs under; the sampler keeps each token\'s')
  if r.correction != 'none':
    raise ValueError(f'{key} cannot go with config.rollout.correction={r.correction!r}: the '
                     'correction weighs a whole sequence recomputed under its behaviour policy, '
                     'which a row continued under a newer policy does not have')
  if r.get('routing_replay', 'none') != 'none':
    raise ValueError(f'{key} cannot go with config.rollout.routing_replay='
                     f'{r.routing_replay!r}: a continued row is re-prefilled, so the experts '
                     'of its earlier tokens are not those the sampler drew them with')
  if c.dapo.dynamic_sampling or r.chunk_prompts:
    raise ValueError(f'{key} does not compose with config.dapo.dynamic_sampling or '
                     'config.rollout.chunk_prompts (the pool of groups in flight replaces both)')


def check_model(c, model_config):
  """A continued row is re-prefilled as a prompt of P + T tokens that may draw T more: P + 2 T
  must fit the model's max_seq_len (before any compute)."""
  P, T = c.data.prompt_width, c.rollout.sampling.max_new_tokens
  if c.rollout.max_decode_steps and P + 2 * T > model_config.max_seq_len:
    raise ValueError(
        f'config.rollout.max_decode_steps={c.rollout.max_decode_steps}: a continued '
        f'row is re-prefilled as a prompt of config.data.prompt_width + max_new_tokens '
        f'= {P + T} tokens, so {P} + 2 x {T} must be <= the model\'s max_seq_len='
        f'{model_config.max_seq_len}')


def _encode_array(x):
  buf = io.BytesIO()
  np.save(buf, np.asarray(x), allow_pickle=False)
  return base64.b64encode(buf.getvalue()).decode('ascii')


def _decode_array(text):
  return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


@dataclasses.dataclass
class Pool:
  """One member's groups in flight (host arrays; group n's rows are its G samples).

  prompts, answers: the groups' problems. tokens_NGT / mask_NGT / logps_NGT / versions_NGT: each
  row's tokens so far (pad after), 1 on them, their log-probs under the policy that drew them and
  its version (NO_VERSION where no token). ended_NG: the row ended (EOS or T tokens); eos_NG: by
  EOS. started_N: the group was sampled at least once. serial_N: the order groups entered.
  """
  prompts: list
  answers: list
  tokens_NGT: np.ndarray
  mask_NGT: np.ndarray
  logps_NGT: np.ndarray
  versions_NGT: np.ndarray
  ended_NG: np.ndarray
  eos_NG: np.ndarray
  started_N: np.ndarray
  serial_N: np.ndarray
  next_serial: int = 0
  rounds: int = 0  # rounds the last step ran (a metric)

  ARRAYS = ('tokens_NGT', 'mask_NGT', 'logps_NGT', 'versions_NGT', 'ended_NG', 'eos_NG',
            'started_N', 'serial_N')

  @classmethod
  def empty(cls, G, T, pad_id):
    z = lambda *shape, dtype: np.zeros((0,) + shape, dtype)
    return cls(prompts=[], answers=[], tokens_NGT=z(G, T, dtype=np.int32) + pad_id,
               mask_NGT=z(G, T, dtype=np.int32), logps_NGT=z(G, T, dtype=np.float32),
               versions_NGT=z(G, T, dtype=np.int32), ended_NG=z(G, dtype=bool),
               eos_NG=z(G, dtype=bool), started_N=z(dtype=bool), serial_N=z(dtype=np.int64))

  def add(self, prompts, answers, pad_id):
    """New groups (not started) for ``prompts``."""
    n = len(prompts)
    grow = lambda x, fill: np.concatenate([x, np.full((n,) + x.shape[1:], fill, x.dtype)])
    self.prompts, self.answers = self.prompts + list(prompts), self.answers + list(answers)
    self.tokens_NGT, self.mask_NGT = grow(self.tokens_NGT, pad_id), grow(self.mask_NGT, 0)
    self.logps_NGT = grow(self.logps_NGT, 0.0)
    self.versions_NGT = grow(self.versions_NGT, NO_VERSION)
    self.ended_NG, self.eos_NG = grow(self.ended_NG, False), grow(self.eos_NG, False)
    self.started_N = grow(self.started_N, False)
    self.serial_N = np.concatenate([self.serial_N, self.next_serial + np.arange(n)])
    self.next_serial += n

  @property
  def complete_N(self):
    return self.ended_NG.all(axis=1)

  def write(self, n_B, g_B, out_B, version):
    """Rows (n_B[i], g_B[i]) continue with row i of the `SampleOutput` ``out_B`` (host), its
    tokens appended after theirs, drawn by policy ``version``."""
    for i, (n, g) in enumerate(zip(n_B, g_B)):
      start, k = int(self.mask_NGT[n, g].sum()), int(np.sum(out_B.completion_mask_RT[i]))
      sl = slice(start, start + k)
      self.tokens_NGT[n, g, sl] = out_B.completion_RT[i, :k]
      self.mask_NGT[n, g, sl] = 1
      self.logps_NGT[n, g, sl] = out_B.logps_RT[i, :k]
      self.versions_NGT[n, g, sl] = version
      self.ended_NG[n, g] = bool(out_B.finished_R[i])
      self.eos_NG[n, g] = bool(out_B.finished_R[i]) and not bool(out_B.truncated_R[i])

  def take(self, n):
    """The ``n`` complete groups that entered first, removed from the pool: (their indices'
    problems and arrays as a dict)."""
    ready = np.flatnonzero(self.complete_N)
    if len(ready) < n:
      raise ValueError(f'the pool has {len(ready)} complete groups, {n} asked')
    chosen = ready[np.argsort(self.serial_N[ready], kind='stable')[:n]]
    keep = np.setdiff1d(np.arange(len(self.prompts)), chosen)
    taken = dict(prompts=[self.prompts[i] for i in chosen],
                 answers=[self.answers[i] for i in chosen],
                 **{k: getattr(self, k)[chosen] for k in self.ARRAYS})
    self.prompts = [self.prompts[i] for i in keep]
    self.answers = [self.answers[i] for i in keep]
    for k in self.ARRAYS:
      setattr(self, k, getattr(self, k)[keep])
    return taken

  def state(self):
    """A JSON-able dict (a checkpoint's): the arrays exactly (npy bytes, base64)."""
    return dict(prompts=self.prompts, answers=self.answers, next_serial=self.next_serial,
                **{k: _encode_array(getattr(self, k)) for k in self.ARRAYS})

  @classmethod
  def from_state(cls, state):
    return cls(prompts=list(state['prompts']), answers=list(state['answers']),
               next_serial=int(state['next_serial']),
               **{k: _decode_array(state[k]) for k in cls.ARRAYS})


def continuation_prompts(gen, pool, n_B, g_B):
  """Rows (n_B[i], g_B[i]) as prompts of their own: [B, P + T] left-padded (the prompt's ids,
  then the row's tokens so far), their masks and [B] budgets (the tokens each may still draw)."""
  T = pool.tokens_NGT.shape[-1]
  prompt_BP, pmask_BP = gen.encode([pool.prompts[n] for n in n_B])
  P = prompt_BP.shape[1]
  tokens_BL = np.full((len(n_B), P + T), gen.tokenizer.pad_id, np.int32)
  mask_BL = np.zeros((len(n_B), P + T), np.int32)
  budget_B = np.zeros(len(n_B), np.int32)
  for i, (n, g) in enumerate(zip(n_B, g_B)):
    seq = np.concatenate(
        [prompt_BP[i][pmask_BP[i] > 0], pool.tokens_NGT[n, g][pool.mask_NGT[n, g] > 0]])
    tokens_BL[i, P + T - len(seq):], mask_BL[i, P + T - len(seq):] = seq, 1
    budget_B[i] = T - int(pool.mask_NGT[n, g].sum())
  return tokens_BL, mask_BL, budget_B


def run_round(gen, params, pools, rng, sampling, *, version, max_decode_steps, temperature=None):
  """Every member's groups not started yet (one call, G samples of each prompt), then every row
  started and not ended (one call, each row its own prompt: `continuation_prompts`), each for at
  most ``max_decode_steps`` decode steps under ``params`` (policy ``version``)."""
  pop, G = gen.population, sampling['num_samples']
  fresh = [np.flatnonzero(~p.started_N) for p in pools]
  rows = [np.argwhere(p.started_N[:, None] & ~p.ended_NG) for p in pools]
  if max(map(len, fresh)):
    if len(set(map(len, fresh))) > 1:
      raise ValueError(f'members have different numbers of new groups: {list(map(len, fresh))}')
    outs = gen.sample(params, [[p.prompts[i] for i in f] for p, f in zip(pools, fresh)],
                      pop.fold_in(rng, 0), sampling, temperature, max_decode_steps=max_decode_steps)
    for p, f, out in zip(pools, fresh, outs):
      p.write(np.repeat(f, G), np.tile(np.arange(G), len(f)), out, version)
      p.started_N[f] = True
  n = max(map(len, rows))
  if not n:
    return
  size = 1 << (n - 1).bit_length()  # a few program shapes: the counts vary from round to round
  built = []
  for p, r in zip(pools, rows):  # padded with rows of budget 0 (not run), one pad token each
    tokens, mask, budget = continuation_prompts(gen, p, r[:, 0], r[:, 1])
    extra = size - len(r)
    pad_mask = np.zeros((extra, mask.shape[1]), np.int32)
    pad_mask[:, -1] = 1
    pad_tokens = np.full_like(pad_mask, gen.tokenizer.pad_id)
    built.append((np.concatenate([tokens, pad_tokens]), np.concatenate([mask, pad_mask]),
                  np.concatenate([budget, np.zeros(extra, np.int32)])))
  outs = gen.sample(params, None, pop.fold_in(rng, 1), dict(sampling, num_samples=1), temperature,
                    encoded_M=[b[:2] for b in built], max_new_tokens_B=[b[2] for b in built],
                    max_decode_steps=max_decode_steps)
  for p, r, out in zip(pools, rows, outs):
    p.write(r[:, 0], r[:, 1], out, version)


def to_rollout(gen, taken, G):
  """A `rollout.Rollout` of the complete groups ``taken`` (`Pool.take`): scored, with each
  token's policy version."""
  rows = lambda x: x.reshape((-1,) + x.shape[2:])
  prompt_BP, pmask_BP = (np.repeat(x, G, axis=0) for x in gen.encode(taken['prompts']))
  completion_BT, mask_BT = rows(taken['tokens_NGT']), rows(taken['mask_NGT'])
  texts = gen.decode(completion_BT, mask_BT)
  rewards_B = np.asarray(
      gen.reward_fn([p for p in taken['prompts'] for _ in range(G)], list(texts),
                    [a for a in taken['answers'] for _ in range(G)]), np.float32)
  return rollout_lib.Rollout(tokens_BL=np.concatenate([prompt_BP, completion_BT], 1),
                             input_mask_BL=np.concatenate([pmask_BP, mask_BT],
                                                          1), completion_BT=completion_BT,
                             completion_mask_BT=mask_BT, sampler_logps_BT=rows(taken['logps_NGT']),
                             truncated_B=rows(taken['ended_NG'] & ~taken['eos_NG']),
                             rewards_B=rewards_B, texts=texts,
                             versions_BT=rows(taken['versions_NGT']),
                             prompts=tuple(p for p in taken['prompts'] for _ in range(G)),
                             answers=tuple(a for a in taken['answers'] for _ in range(G)))


def collect(gen, params, next_examples_M, rng, *, pools, version, c, sampling, temperature=None,
            **unused):
  """An RL step's rollouts under partial rollouts (the arguments of `rollout.collect`, plus the
  members' ``pools``, the drawing policy's ``version`` and the run config ``c``): new groups (whole
  batches of the prompt stream) join each member's pool until it holds IN_FLIGHT x
  prompts_per_step groups, rounds (`run_round`) run until every member has prompts_per_step
  complete groups, and those, the earliest started first, leave the pool as that member's
  `Rollout`. Returns (rollouts, [0] * members: no dynamic-sampling rounds); the rounds run are
  kept on the pools."""
  pop, n = gen.population, c.rollout.prompts_per_step
  for pool, next_examples in zip(pools, next_examples_M):
    while len(pool.prompts) < IN_FLIGHT * n:  # the first step draws IN_FLIGHT batches
      examples = next_examples()
      pool.add(examples['prompt'], examples['answer'], gen.tokenizer.pad_id)
  rounds = 0
  while min(int(p.complete_N.sum()) for p in pools) < n:
    run_round(gen, params, pools, pop.fold_in(rng, rounds), sampling, version=version,
              max_decode_steps=c.rollout.max_decode_steps, temperature=temperature)
    rounds += 1
  for pool in pools:
    pool.rounds = rounds
  return [to_rollout(gen, p.take(n), sampling['num_samples']) for p in pools], [0] * len(pools)


def init_pools(c, model_config, members, pad_id):
  """None (partial rollouts off), or each member's empty `Pool` (the model checked first)."""
  if not c.rollout.get('max_decode_steps', 0):
    return None
  check_model(c, model_config)
  G, T = c.rollout.sampling.num_samples, c.rollout.sampling.max_new_tokens
  return [Pool.empty(G, T, pad_id) for _ in range(members)]


def pools_state(pools):
  """A checkpoint's extra entries for ``pools`` ({} when off)."""
  return {} if pools is None else {'partial_pools': [p.state() for p in pools]}


def restore_pools(pools, extra):
  """The pools of a checkpoint's ``extra`` (``pools`` as they are when off)."""
  return pools if pools is None else [Pool.from_state(s) for s in extra['partial_pools']]


def metrics(pools, m, rollout, step):
  """Member m's partial-rollout metrics at RL step ``step`` ({} when off): rounds run, groups left
  in flight, and the share of the trained tokens drawn k = 0, 1, 2, ... versions ago."""
  if pools is None:
    return {}
  mask = rollout.completion_mask_BT > 0
  lag = (step - 1) - rollout.versions_BT[mask]
  out = {'partial/rounds': pools[m].rounds, 'partial/groups_in_flight': len(pools[m].prompts)}
  out.update({f'partial/tokens_lag_{k}': float(np.mean(lag == k)) for k in np.unique(lag)})
  return out
