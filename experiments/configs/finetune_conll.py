r"""Token tagging on CoNLL-format files (e.g. CoNLL-2003 English NER) with the original recipe.

  python -m experiments.finetune_tagging --config=experiments/configs/finetune_conll.py \
      --config.train_file=conll2003/eng.train --config.dev_file=conll2003/eng.testa \
      --config.test_file=conll2003/eng.testb --config.init_from=cased_L-12_H-768_A-12 \
      --config.do_lower_case=False --workdir=workdirs/conll2003

Any scheme conlleval reads works (BIO, IOB1, IOBES); the tag set is the training file's.
"""

import ml_collections

from experiments.configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
    config = finetune_base.tagging("conll")  # the files are required: see the command above
    config.do_lower_case = False  # NER wants a cased model (capitals mark names)
    return config
