r"""`python -m jtc.sft`: supervised fine-tuning of the base policies (the code is `jtc.rl.sft`).

  python -m jtc.sft --config configs/sft_arith.py --workdir W
"""
from jtc import files
from jtc.rl.sft import run_main

if __name__ == '__main__':
  with files.report_damage():
    run_main()
