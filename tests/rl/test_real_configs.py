"""The real-model path: configs/real/* in smoke mode against a tiny random Hugging Face checkpoint.

One tiny checkpoint is written per session in the Hugging Face layout (`config.json`,
`model.safetensors` via `hf_import.export_hf_checkpoint`, a byte-level `tokenizers`
`tokenizer.json` and a `tokenizer_config.json` with a chat template and eos/pad tokens), plus a
tiny GSM8K-style JSONL. Each real config then runs end to end in-process (load, sample, score,
update, checkpoint) and a second Trainer on the same workdir resumes from the checkpoint.
Also: the boxed reward, the chat template reaching the prompts, gradient accumulation
giving the same update as the un-split mini-batch, and the same tiny GSM8K as a verl-style
parquet directory, a saved Hugging Face dataset and JSONL with other field names each training.
"""

import dataclasses
import glob
import importlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pyarrow as pa
import pyarrow.parquet as pq

from jtc.rl import checkpoints
from jtc.rl import config_check
from jtc.data import examples
from jtc.data import formats
from jtc.data import pipeline as data_lib
from jtc.models import hf_import
from jtc.models import tiny_checkpoint
from jtc.analysis import ledger
from jtc.analysis import metric_writer
from jtc.analysis import samples
from jtc.models import model as model_lib
from jtc.models import logprobs
from jtc.data import rewards
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import trainer as trainer_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL = sorted(
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(REPO, 'configs', 'real', '*.py'))
    if os.path.basename(p) not in ('__init__.py', 'base.py'))


def write_tiny_hf_checkpoint(path, *, arch='qwen3'):
  """A random tiny Qwen3 (or Llama) checkpoint + byte-level tokenizer in the HF layout: what
  `jtc tiny-checkpoint PATH --like ARCH` writes."""
  return tiny_checkpoint.write(path, like=arch, seed=0)


# (question, GSM8K answer) rows of the tiny dataset: train is all of them, test the first two.
TINY_GSM8K = [(f'What is {a} plus {b}?', f'{a} + {b} = {a + b}\n#### {a + b}')
              for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1)]]


@pytest.fixture(scope='session')
def tiny_hf(tmp_path_factory):
  root = tmp_path_factory.mktemp('real')
  ckpt = str(root / 'tiny_qwen3')
  write_tiny_hf_checkpoint(ckpt)
  data = root / 'gsm'
  data.mkdir()
  for split, part in (('train', TINY_GSM8K), ('test', TINY_GSM8K[:2])):
    with open(data / f'{split}.jsonl', 'w') as f:
      for q, a in part:
        f.write(json.dumps({'question': q, 'answer': a}) + '\n')
  return dict(checkpoint=ckpt, dataset=str(data), data_dir=str(root / 'cache'))


@pytest.fixture(scope='session')
def tiny_hf_moe(tiny_hf, tmp_path_factory):
  """``tiny_hf`` with a random tiny Qwen3-MoE checkpoint instead (4 experts, 2 per token)."""
  ckpt = str(tmp_path_factory.mktemp('real_moe') / 'tiny_qwen3_moe')
  config = tiny_checkpoint.model_config('qwen3', n_experts=4, experts_per_token=2, d_expert=64,
                                        norm_topk_prob=True)
  tokenizer_lib.write_byte_level_hf(ckpt)
  hf_import.export_hf_checkpoint(config, model_lib.init_params(config, jax.random.key(0)), ckpt,
                                 torch_dtype='bfloat16')
  return {**tiny_hf, 'checkpoint': ckpt}


# The real configs of a mixture-of-experts policy: their smoke runs load ``tiny_hf_moe``.
MOE = ('qwen3_30b_a3b_math_dapo',)
# The hybrid configs run against a tiny hybrid checkpoint of their architecture, ledger on.
HYBRID = {'qwen3_5_2b_gsm8k_dfpo': 'qwen3_5', 'qwen3_next_80b_a3b_aime_dfpo': 'qwen3_next'}


def _real_config(name, tiny_hf, **overrides):
  c = importlib.import_module(f'configs.real.{name}').get_config('smoke')
  with c.unlocked():
    c.policy.checkpoint = tiny_hf['checkpoint']
    c.data.dataset = tiny_hf['dataset']
    c.data.data_dir = tiny_hf['data_dir']
    for k, v in overrides.items():  # dotted keys: 'data.reward'
      *parents, leaf = k.split('.')
      node = c
      for part in parents:
        node = node[part]
      node[leaf] = v
  return c


@pytest.mark.parametrize('name', REAL)
def test_real_config_validates_and_documents_its_run(name):
  module = importlib.import_module(f'configs.real.{name}')
  c = module.get_config(None)
  assert f'configs/real/{name}.py' in module.__doc__
  o, e = c.optim, c.eval.sampling
  assert o.learning_rate == 8e-7 and o.min_lr_ratio == 0.2 and o.warmup_frac == 0.03
  assert c.rollout.sampling.num_samples == 32 and o.minibatch_prompts == 32
  # Appendix J: Qwen3's evaluation decoding, and Qwen3-Next's own.
  want = (0.7, 0.8, 20, 0.0) if 'qwen3_next' in name else (0.6, 0.95, 20, 0.0)
  assert (e.temperature, e.top_p, e.top_k, e.min_p) == want
  assert e.max_new_tokens == c.rollout.sampling.max_new_tokens
  # Without a checkpoint and a dataset the config refuses to run, naming the keys.
  with pytest.raises(ValueError, match='config.policy.checkpoint'):
    config_check.validate(c)
  with c.unlocked():
    c.policy.checkpoint = REPO  # not an HF directory
  with pytest.raises(ValueError, match='config.policy.checkpoint.*no config.json'):
    config_check.validate(c)
  with c.unlocked():
    c.policy.checkpoint, c.policy.init = '', 'base'
  with pytest.raises(ValueError, match='config.data.dataset'):
    config_check.validate(c)


def even_length_reward(prompts, completions, answers):
  """1 for a completion with an even number of characters: a deterministic reward of the
  completion alone that a random policy earns about half the time, so groups split and the
  update is non-zero (the checkpoint's task reward is 0 for every random completion)."""
  del prompts, answers
  return np.asarray([len(c) % 2 == 0 for c in completions], np.float32)


# The Llama, DAPO, 14B, 32B, MoE and hybrid smoke runs are slow-only (CI time); the HF import
# tests cover Llama, the 8B DelTA config covers the 8B math task and the 0.6B config DFPO
# Min-Replace (the 32B's), tests/rl/test_routing.py a MoE run with routing replay.
SMOKE = [
    pytest.param(n, marks=pytest.mark.slow) if n in ('llama3_1b_gsm8k_grpo', 'qwen3_8b_math_dapo',
                                                     'qwen3_8b_math_delta', 'qwen3_14b_math_delta',
                                                     'qwen3_32b_aime_dfpo', *MOE, *HYBRID) else n
    for n in REAL
]


@pytest.fixture(scope='session')
def tiny_hybrids(tmp_path_factory):
  """like -> a lazily written tiny checkpoint directory of that hybrid architecture."""
  root, written = tmp_path_factory.mktemp('real_hybrid'), {}

  def get(like):
    if like not in written:
      written[like] = str(root / like)
      write_tiny_hf_checkpoint(written[like], arch=like)
    return written[like]

  return get


@pytest.mark.parametrize('name', SMOKE)
def test_real_config_smoke_runs_checkpoints_and_resumes(name, request, tmp_path, monkeypatch):
  tiny_hf = request.getfixturevalue('tiny_hf_moe' if name in MOE else 'tiny_hf')
  workdir = str(tmp_path)
  monkeypatch.setitem(rewards.REWARD_FNS, 'test_even_length', even_length_reward)
  overrides = {'data.reward': 'test_even_length'}
  if name in HYBRID:
    tiny_hf = dict(tiny_hf, checkpoint=request.getfixturevalue('tiny_hybrids')(HYBRID[name]))
    overrides['log.ledger_every'] = 1
  c = _real_config(name, tiny_hf, **overrides)
  trainer = trainer_lib.Trainer(c, workdir)
  start_params = jax.tree.map(np.array, trainer.state.params)
  # The HF model, tokenizer (eos/pad from tokenizer_config.json) and chat template are in use.
  assert trainer.model_config.vocab_size == 272 and trainer.model_config.qk_norm
  assert trainer.model_config.param_dtype == 'float32'  # master weights
  assert trainer.model_config.dtype == 'bfloat16'  # compute
  assert trainer.model_config.remat
  assert ('linear_attention' in trainer.model_config.layer_types) == (name in HYBRID)
  assert trainer.tokenizer.eos_id == trainer.tokenizer._tok.token_to_id('<|im_end|>')
  assert trainer.tokenizer.pad_id == trainer.tokenizer._tok.token_to_id('<|endoftext|>')
  with c.unlocked():
    c.num_steps = 1
  trainer.c = c
  trainer.run()
  with c.unlocked():
    c.num_steps = 2
  resumed = trainer_lib.Trainer(c, workdir)
  assert resumed.run_state.count('rl_steps') == 1
  resumed.run()
  records = metric_writer.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in records] == [0, 1, 2]
  assert 'eval/avg@2' in records[0] and 'eval/avg@2' in records[-1]
  assert records[-1]['compute/update_steps'] == 2
  for r in records[1:]:
    assert np.isfinite(r['loss']) and np.isfinite(r['grad_norm']), r
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '2'))
  if name in HYBRID:  # the per-token ledger of every step, across the resume
    assert ledger.steps(workdir) == [1, 2]
  # The update path really ran: some group had unequal rewards, the gradient was non-zero and
  # the parameters moved (weight decay is 0 in these configs, so only the gradient moves them).
  assert min(r['adv/frac_zero_std'] for r in records[1:]) < 1, records
  assert max(r['grad_norm'] for r in records[1:]) > 0, records
  moved = [
      np.abs(a - b).max()
      for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(start_params))
  ]
  assert max(moved) > 0


def test_prompts_carry_the_chat_template_and_suffix(tiny_hf):
  tok = tokenizer_lib.HFTokenizer.from_dir(tiny_hf['checkpoint'])
  c = _real_config('qwen3_0_6b_gsm8k_dfpo', tiny_hf)
  tokens, mask = data_lib.encode_prompts(tok, ['What is 1 plus 2?' + c.data.prompt_suffix],
                                         width=c.data.prompt_width)
  text = tok._tok.decode(tokens[0][mask[0] > 0].tolist(), skip_special_tokens=False)
  assert text == ('<|im_start|>user\nWhat is 1 plus 2?\nPlease reason step by step, and put '
                  'your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n')


def test_hf_checkpoint_loads_as_master_f32_with_bf16_compute(tiny_hf):
  c = _real_config('qwen3_8b_math_dapo', tiny_hf)
  mc, params, tok = checkpoints.load_policy(c.policy)
  assert mc.param_dtype == 'float32' and mc.dtype == 'bfloat16' and mc.remat
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
  ref_mc, ref_params = hf_import.load_hf_checkpoint(tiny_hf['checkpoint'], param_dtype='float32')
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    np.testing.assert_array_equal(a, b)
  out = logprobs.sequence_logprobs(params, mc, jnp.ones((1, 6), jnp.int32),
                                   jnp.ones((1, 6), jnp.int32), completion_start=2)
  assert out['logps'].dtype == jnp.float32  # log-probs stay f32 under bf16 compute
  ref = logprobs.sequence_logprobs(params, dataclasses.replace(mc, dtype='float32'),
                                   jnp.ones((1, 6), jnp.int32), jnp.ones((1, 6), jnp.int32),
                                   completion_start=2)
  np.testing.assert_allclose(out['logps'], ref['logps'], atol=0.1)
  assert tok.eos_id is not None


SYSTEM = 'You are a careful solver.'
VERL_PROMPT = '{} Output the final answer after "####".'


def _verl_gsm8k(root, splits):
  """Splits of (question, answer) rows as verl's GSM8K preprocessing writes them (a user message
  with its instruction, the final answer as reward_model.ground_truth), with a system message
  first, as some verl datasets have."""
  for split, rows in splits.items():
    pq.write_table(
        pa.Table.from_pylist([{
            'data_source': 'openai/gsm8k',
            'prompt': [{
                'role': 'system',
                'content': SYSTEM
            }, {
                'role': 'user',
                'content': VERL_PROMPT.format(q)
            }],
            'ability': 'math',
            'reward_model': {
                'style': 'rule',
                'ground_truth': a.split('#### ')[1]
            },
            'extra_info': {
                'split': split,
                'index': i,
                'answer': a,
                'question': q
            }
        } for i, (q, a) in enumerate(rows)]), str(root / f'{split}.parquet'))


def _saved_hf(root, splits):
  datasets = pytest.importorskip('datasets', reason='datasets writes the save_to_disk layout')
  datasets.DatasetDict({
      split:
          datasets.Dataset.from_dict({
              'question': [q for q, _ in rows],
              'answer': [a for _, a in rows]
          }) for split, rows in splits.items()
  }).save_to_disk(str(root))


def _custom_jsonl(root, splits):
  for split, rows in splits.items():
    with open(root / f'{split}.jsonl', 'w') as f:
      f.write(''.join(json.dumps({'instruction': q, 'target': a}) + '\n' for q, a in rows))


# format -> (writer of {split: rows} under a directory, config overrides, the prompt that a
# question reads as).
DATASET_FORMATS = {
    'verl_parquet': (_verl_gsm8k, {
        'data.prompt_suffix': ''
    }, lambda q: f'{SYSTEM}\n\n{VERL_PROMPT.format(q)}'),
    'hf_saved': (_saved_hf, {}, lambda q: q),
    'jsonl_fields': (_custom_jsonl, {
        'data.question_field': 'instruction',
        'data.answer_field': 'target'
    }, lambda q: q),
}

# verl's parquet in the fast set; the saved Hugging Face dataset and the named JSONL fields are
# slow-only (CI time: their readers are tested fast in tests/data/test_formats.py).
FORMAT_RUNS = [
    f if f == 'verl_parquet' else pytest.param(f, marks=pytest.mark.slow) for f in DATASET_FORMATS
]


@pytest.mark.parametrize('fmt', FORMAT_RUNS)
def test_each_dataset_format_trains_a_smoke_config(fmt, tiny_hf, tmp_path, monkeypatch):
  write, overrides, prompt_of = DATASET_FORMATS[fmt]
  root = tmp_path / fmt
  root.mkdir()
  write(root, {'train': TINY_GSM8K, 'test': TINY_GSM8K[:2]})
  monkeypatch.setitem(rewards.REWARD_FNS, 'test_even_length', even_length_reward)
  c = _real_config('qwen3_0_6b_gsm8k_dfpo', tiny_hf, **{
      'data.dataset': str(root),
      'data.reward': 'test_even_length',
      **overrides
  })
  config_check.validate(c)
  trainer = trainer_lib.Trainer(c, str(tmp_path / 'run'))
  # The held-out split reads back as written: the prompts and their final answers (verl's
  # system + user messages as a Conversation, which the chat template renders).
  assert [(e['prompt'], e['answer']) for e in trainer.eval_examples
         ] == [(prompt_of(q), a.split('#### ')[1]) for q, a in TINY_GSM8K[:2]]
  assert all(
      isinstance(e['prompt'], examples.Conversation) == (fmt == 'verl_parquet')
      for e in trainer.eval_examples)
  with c.unlocked():  # one step; the jitted step built for the smoke run's two (compile cache)
    c.num_steps = 1
  trainer.c = c
  trainer.run()
  records = metric_writer.read_jsonl(str(tmp_path / 'run' / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [0, 1] and 'eval/avg@2' in records[0]
  assert np.isfinite(records[-1]['loss']) and np.isfinite(records[-1]['grad_norm'])


# A user's reward function, unchanged (tests/data/user_rewards.py), trains a smoke run: verl's
# compute_score per sample and TRL's batched reward_funcs. Slow (CI time: the pool and both
# signatures are tested fast in tests/data/test_custom_rewards.py).
USER_REWARDS = {
    'verl': ('even_length', lambda text: float(len(text) % 2 == 0)),
    'trl': ('reward_len', lambda text: float(-abs(20 - len(text)))),
}


@pytest.mark.slow
@pytest.mark.parametrize('signature', sorted(USER_REWARDS))
def test_a_users_reward_function_trains_a_smoke_run(signature, tiny_hf, tmp_path):
  """Each logged sample's reward is the user's function of its completion (an independent
  reference: the function called here), and the step trains (finite loss)."""
  name, reference = USER_REWARDS[signature]
  root = tmp_path / 'verl'
  root.mkdir()
  _verl_gsm8k(root, {'train': TINY_GSM8K, 'test': TINY_GSM8K[:2]})
  c = _real_config(
      'qwen3_0_6b_gsm8k_dfpo', tiny_hf, **{
          'data.dataset': str(root),
          'data.prompt_suffix': '',
          'data.reward': f'tests.data.user_rewards:{name}',
          'data.reward_signature': signature,
          'data.verify_workers': 1,
          'num_steps': 1,
      })
  config_check.validate(c)
  trainer_lib.Trainer(c, str(tmp_path / 'run')).run()
  records = metric_writer.read_jsonl(str(tmp_path / 'run' / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [0, 1] and np.isfinite(records[-1]['loss'])
  logged = samples.read(str(tmp_path / 'run'))
  assert logged and all(r['reward'] == reference(r['completion']) for r in logged)
