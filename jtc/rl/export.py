"""A run's trained policy as a Hugging Face directory (`jtc export WORKDIR OUT`).

`export(workdir, out)` reads the run's ``config.json``, loads its starting policy as the trainer
did (`checkpoints.load_policy`: the model's shape and tokenizer), restores the parameters of its
latest checkpoint and writes ``config.json`` + ``model.safetensors``
(`hf_import.export_hf_checkpoint`; a LoRA run's adapters merged into the base) and the tokenizer:
the files of the run's Hugging Face checkpoint, or, for a jtc policy with the character tokenizer,
an equivalent Hugging Face ``tokenizer.json`` (`char_tokenizer_json`: same ids, same text) with its
chat template. ``transformers.AutoModelForCausalLM`` and ``--config.policy.checkpoint`` load the
result; a population exports one member (``member``).
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import ml_collections
import orbax.checkpoint as ocp

from jtc import files
from jtc.models import hf_import
from jtc.models import lora as lora_lib
from jtc.models import tokenizer as tokenizer_lib
from jtc.rl import checkpoints
from jtc.rl import workdir as workdir_lib

# The files of a Hugging Face tokenizer copied from a run's checkpoint, when present.
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                   'generation_config.json', 'chat_template.jinja', 'vocab.json', 'merges.txt')


def run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run in ``workdir`` was made with (its config.json); ValueError without one."""
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  if not os.path.isfile(path):
    raise ValueError(f'{workdir} holds no run (no {workdir_lib.CONFIG_FILE}): name the --workdir '
                     'of a jtc train run')
  stored = files.read_json(path, keys=('config',), expected='the config of the run in this workdir')
  return ml_collections.ConfigDict(stored['config'])


def latest_params(workdir: str, *, member: int | None = None):
  """(step, the trained parameters) of the newest checkpoint in ``workdir`` (a population's:
  member ``member``), as host arrays."""
  directory = os.path.join(workdir, 'checkpoints')
  manager = ocp.CheckpointManager(directory, item_names=('state',),
                                  item_handlers={'state': ocp.StandardCheckpointHandler()})
  try:
    step = manager.latest_step()
    if step is None:
      raise ValueError(f'{workdir} has no checkpoint yet (checkpoints are written every '
                       'log.ckpt_every steps and at the end of a run)')
    with files.reading(os.path.join(directory, str(step)), 'a checkpoint of the run'):
      state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  finally:
    manager.close()
  params = state.state['params']
  if member is not None:
    params = jax.tree.map(lambda x: x[member], params)
  return step, params


def char_tokenizer_json(tokenizer: tokenizer_lib.CharTokenizer) -> str:
  """A Hugging Face ``tokenizer.json`` with ``tokenizer``'s ids: one token per character of its
  alphabet (WordLevel, each character split off), the special tokens pad, eos, bos."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  from tokenizers import Regex, decoders, models, pre_tokenizers  # pylint: disable=import-outside-toplevel
  specials = (tokenizer_lib.PAD, tokenizer_lib.EOS, tokenizer_lib.BOS)
  vocab = {name: i for i, name in enumerate(specials)}
  vocab.update({c: tokenizer.encode(c)[0] for c in tokenizer.alphabet})
  tok = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=tokenizer_lib.PAD))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex('.|\n'), behavior='isolated')
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens(list(specials))
  return tok.to_str()


def write_tokenizer(tokenizer, policy, out: str) -> None:
  """The run's tokenizer in ``out``: its checkpoint's files, or a character tokenizer converted."""
  if policy.checkpoint:
    for name in TOKENIZER_FILES:
      if os.path.isfile(os.path.join(policy.checkpoint, name)):
        shutil.copy(os.path.join(policy.checkpoint, name), os.path.join(out, name))
    return
  if not isinstance(tokenizer, tokenizer_lib.CharTokenizer):
    raise ValueError(f'no Hugging Face form for a {type(tokenizer).__name__}')
  with open(os.path.join(out, 'tokenizer.json'), 'w') as f:
    f.write(char_tokenizer_json(tokenizer))
  template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
              f'{{{{ {json.dumps(tokenizer.chat_separator)} }}}}')
  with open(os.path.join(out, 'tokenizer_config.json'), 'w') as f:
    json.dump(
        {
            'pad_token': tokenizer_lib.PAD,
            'eos_token': tokenizer_lib.EOS,
            'bos_token': tokenizer_lib.BOS,
            'chat_template': template
        }, f, indent=1)


def export(workdir: str, out: str, *, member: int | None = None) -> int:
  """Writes the run's latest policy to ``out`` (refused when ``out`` holds files); returns the
  checkpoint's step."""
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ValueError(f'{out} exists and is not an empty directory; nothing was written')
  c = run_config(workdir)
  if c.population.size > 1 or c.population.vary:
    if member is None:
      raise ValueError(f'{workdir} holds a population: name the member to export (--member N, '
                       '0-based, in the order of its members/ folders)')
  elif member is not None:
    raise ValueError(f'{workdir} holds one run, not a population: --member is not needed')
  model_config, base, tokenizer = checkpoints.load_policy(c.policy)
  step, params = latest_params(workdir, member=member)
  if c.lora.rank:  # the checkpoint holds the adapters of the frozen base
    params = lora_lib.Adapted(base, params, scale=lora_lib.scale(c.lora))
  os.makedirs(out, exist_ok=True)
  hf_import.export_hf_checkpoint(model_config, params, out, torch_dtype=model_config.param_dtype)
  write_tokenizer(tokenizer, c.policy, out)
  return step
