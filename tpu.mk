# Cloud TPU VM targets (included by the Makefile). docs/tpu.md walks through a whole run.
#
#   make tpu-create tpu-setup tpu-data tpu-pretrain BUCKET=gs://my-bucket PROJECT=my-project
#   make tpu-pretrain ... DRY_RUN=1     prints the exact commands instead of running them
#
# Every run reads and writes one bucket (see experiments/configs/cloud_tpu.py):
#   $(BUCKET)/wikibooks/...                 vocab and TFRecords (make tpu-data)
#   $(BUCKET)/runs/<config>_<phase>/        --workdir: checkpoints, metrics, TensorBoard

PROJECT ?= my-gcp-project
ZONE ?= europe-west4-a
TPU_NAME ?= bert-tpu
# The slice (v3-128, v4-32, v5litepod-16, ...); empty: CONFIG's topology's (v3:4x4 -> v3-32).
ACCELERATOR_TYPE ?=
# tpu-ubuntu2204-base serves v2/v3/v4; v5e wants v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5.
RUNTIME_VERSION ?= tpu-ubuntu2204-base
BUCKET ?= gs://YOUR_BUCKET
CONFIG ?= experiments/configs/bert_base_paper.py
# The config's variant (`--config=FILE:PHASE`); empty for configs without variants.
PHASE ?= phase1
# Extra flags for the training/fine-tuning command, e.g. ARGS='--config.log_every=10'.
ARGS ?=
# 1: print the commands (one per line, exactly as they would run) and run nothing.
DRY_RUN ?=
# 1: tpu-pretrain/tpu-finetune stay attached (the spot loop needs that); else nohup + log.
FOREGROUND ?=

TPU_QUEUED_RESOURCE ?= $(TPU_NAME)-qr
TPU_RUN_NAME ?= $(basename $(notdir $(CONFIG)))$(if $(PHASE),_$(PHASE))
TPU_WORKDIR ?= $(BUCKET)/runs/$(TPU_RUN_NAME)
TPU_DATA_DIR ?= $(BUCKET)/wikibooks
TPU_CONFIG_ARG = $(CONFIG)$(if $(PHASE),:$(PHASE))
TPU_TARBALL ?= /tmp/bert_jax-$(TPU_NAME).tar.gz

# Fine-tuning from a pretraining run's workdir (phase 2 by default). The fine-tuning
# scripts read and write local files, so the run's checkpoints and the vocab are copied
# to each worker first, and results stay on the worker, under ~/bert_jax.
FINETUNE_SCRIPT ?= experiments.finetune_classification
FINETUNE_CONFIG ?= experiments/configs/finetune_glue.py:mrpc
INIT_FROM ?= $(BUCKET)/runs/$(basename $(notdir $(CONFIG)))_phase2
FINETUNE_WORKDIR ?= finetune_runs/$(basename $(subst .py:,_,$(notdir $(FINETUNE_CONFIG))))
TPU_PRETRAINED = pretrained/$(notdir $(INIT_FROM))

# Pretraining data (tpu-data runs tpu-data-local on worker 0). BookCorpus is no longer
# distributed; PG-19 (public-domain books) stands in for it.
WIKI_TFDS ?= wikipedia/20230601.en
BOOKS_TFDS ?= pg19
TFDS_DATA_DIR ?=
VOCAB_URL ?= https://storage.googleapis.com/bert_models/2018_10_18/uncased_L-12_H-768_A-12.zip
TPU_LOCAL_DATA ?= $(HOME)/wikibooks
DATA_WORKERS ?= 32
DUPE_FACTOR ?= 5
TRAIN_SHARDS ?= 256
# What makes the records (docs/data_at_scale.md): local (create_pretraining_data's
# DATA_WORKERS processes on worker 0, the default), direct (the same records from
# data_pipelines.beam_records on Beam's DirectRunner, DATA_WORKERS processes, on worker 0),
# or dataflow (a Dataflow job submitted from here, writing straight into the bucket; a dry
# run printing each job, needing no cloud account, unless DATAFLOW_SUBMIT=1).
RUNNER ?= local
DATAFLOW_REGION ?= europe-west4
DATAFLOW_MACHINE_TYPE ?= n2-standard-4
DATAFLOW_MAX_WORKERS ?= 100
# The workers' image: Beam's SDK image with data_pipelines/beam_requirements.txt, TensorFlow
# (gs:// and tfds: reads) and the project (docs/data_at_scale.md builds it).
BEAM_IMAGE ?= europe-docker.pkg.dev/$(PROJECT)/bert-jax/beam-records:2.77.0
DATAFLOW_SUBMIT ?=
TFDS_PARTS ?= 64
ifeq ($(filter $(RUNNER),local direct dataflow),)
$(error RUNNER=$(RUNNER): local, direct or dataflow)
endif

# Every TPU config and variant the fit check covers.
AOT_CONFIGS ?= bert_base_paper.py:phase1 bert_base_paper.py:phase2 \
	bert_large_paper.py:phase1 bert_large_paper.py:phase2 \
	bert_large_lamb.py:phase1 bert_large_lamb.py:phase2 \
	bert_large_v4.py:phase1 bert_large_v4.py:phase2 \
	bert_large_v5e.py:phase1 bert_large_v5e.py:phase2 \
	electra_paper.py:small electra_paper.py:base \
	modernbert_base_tpu.py:phase1 modernbert_base_tpu.py:phase2
AOT_ARGS ?=

# Targets that create a slice or launch CONFIG on one. Before they run (DRY_RUN included),
# experiments.tpu_slice names the slice (ACCELERATOR_TYPE, else the config's topology) and
# refuses one that CONFIG's mesh and global batch do not fit; make then stops.
TPU_SLICE_TARGETS = tpu-create tpu-qr-create tpu-pretrain tpu-spot-pretrain
ifneq ($(filter $(TPU_SLICE_TARGETS),$(MAKECMDGOALS)),)
TPU_ACCELERATOR_TYPE := $(shell $(PY) -m experiments.tpu_slice --config=$(TPU_CONFIG_ARG) \
	$(if $(ACCELERATOR_TYPE),--accelerator_type=$(ACCELERATOR_TYPE)))
ifeq ($(TPU_ACCELERATOR_TYPE),)
$(error no slice for $(TPU_CONFIG_ARG): see the line above)
endif
endif

TPU_FLAGS = --zone=$(ZONE) --project=$(PROJECT)
TPU_SLICE = --accelerator-type=$(TPU_ACCELERATOR_TYPE)
TPU_QR_SLICE = --node-id=$(TPU_NAME) $(TPU_SLICE) --runtime-version=$(RUNTIME_VERSION)
TPU_VM = gcloud compute tpus tpu-vm
TPU_QR = gcloud compute tpus queued-resources
TPU_SSH = $(TPU_VM) ssh $(TPU_NAME) $(TPU_FLAGS)

# On the workers: Python 3.11 (the project's pin) beside the image's, then the project.
TPU_SETUP_CMD = sudo apt-get -qq update && sudo apt-get -qq install -y python3.11 python3.11-venv \
	&& mkdir -p ~/bert_jax && tar -xzf ~/bert_jax.tar.gz -C ~/bert_jax && cd ~/bert_jax \
	&& (test -x .venv/bin/python || python3.11 -m venv .venv) \
	&& .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e '.[tpu,data]'
TPU_DATA_VARS = BUCKET=$(BUCKET) WIKI_TFDS=$(WIKI_TFDS) BOOKS_TFDS=$(BOOKS_TFDS) \
	TFDS_DATA_DIR=$(TFDS_DATA_DIR) DATA_WORKERS=$(DATA_WORKERS) DUPE_FACTOR=$(DUPE_FACTOR) \
	TRAIN_SHARDS=$(TRAIN_SHARDS)$(if $(filter direct,$(RUNNER)), RUNNER=direct TFDS_PARTS=$(TFDS_PARTS))
TPU_PRETRAIN_CMD = .venv/bin/python -m experiments.pretrain --config=$(TPU_CONFIG_ARG) \
	--config.bucket=$(BUCKET) --workdir=$(TPU_WORKDIR) --distributed $(ARGS)
TPU_FETCH_PRETRAINED = mkdir -p $(TPU_PRETRAINED)/checkpoints \
	&& gcloud storage rsync --recursive $(INIT_FROM)/checkpoints $(TPU_PRETRAINED)/checkpoints \
	&& gcloud storage cp $(TPU_DATA_DIR)/vocab.txt $(TPU_PRETRAINED)/
TPU_FINETUNE_CMD = .venv/bin/python -m $(FINETUNE_SCRIPT) --config=$(FINETUNE_CONFIG) \
	--config.init_from=$(TPU_PRETRAINED) --config.vocab_file=$(TPU_PRETRAINED)/vocab.txt \
	--workdir=$(FINETUNE_WORKDIR) $(ARGS)
TPU_FINETUNE_REMOTE = $(call tpu_on_workers,$(TPU_FINETUNE_CMD),finetune,$(TPU_FETCH_PRETRAINED))
# In ~/bert_jax on every worker: $(3) (optional, first), then $(1), logging to
# ~/logs/$(2).log and detached, unless FOREGROUND=1.
tpu_on_workers = cd ~/bert_jax && $(if $(3),$(3) && )$(if $(filter 1,$(FOREGROUND)),$(1),mkdir \
	-p ~/logs && nohup $(1) > ~/logs/$(2).log 2>&1 < /dev/null &)

TPU_TARGETS = tpu-create tpu-setup tpu-data tpu-data-local tpu-pretrain tpu-finetune tpu-ssh \
	tpu-logs tpu-delete tpu-qr-create tpu-qr-status tpu-qr-delete tpu-spot-pretrain aot-check
.PHONY: $(TPU_TARGETS)

ifeq ($(DRY_RUN),1)
# make hands each recipe line to `$(SHELL) $(.SHELLFLAGS) LINE`: print LINE, run nothing.
$(TPU_TARGETS): .SHELLFLAGS = -c 'printf "%s\n" "$$0"'
.SILENT: $(TPU_TARGETS)
endif

tpu-create:  ## create the TPU VM slice TPU_NAME (on-demand)
	$(TPU_VM) create $(TPU_NAME) $(TPU_FLAGS) $(TPU_SLICE) --version=$(RUNTIME_VERSION)

tpu-setup:  ## install the committed tree (git HEAD) and its TPU deps on every worker
	git archive --format=tar.gz --output=$(TPU_TARBALL) HEAD
	$(TPU_VM) scp $(TPU_TARBALL) $(TPU_NAME):~/bert_jax.tar.gz $(TPU_FLAGS) --worker=all
	$(TPU_SSH) --worker=all --command="$(TPU_SETUP_CMD)"

tpu-data:  ## Wikipedia + books (TFDS) -> records for T=128 and T=512 in BUCKET (RUNNER=local|direct|dataflow)
ifeq ($(RUNNER),dataflow)
	$(if $(DATAFLOW_SUBMIT),mkdir -p $(TPU_LOCAL_DATA) && curl -sSL -o $(TPU_LOCAL_DATA)/bert.zip $(VOCAB_URL) && unzip -p $(TPU_LOCAL_DATA)/bert.zip '*/vocab.txt' > $(TPU_LOCAL_DATA)/vocab.txt && gcloud storage cp $(TPU_LOCAL_DATA)/vocab.txt $(TPU_DATA_DIR)/vocab.txt,test -x $(BEAM_PY) || $(MAKE) --no-print-directory beam-venv)
	$(call tpu_records_for,128,20)
	$(call tpu_records_for,512,80)
else
	$(TPU_SSH) --worker=0 --command="cd ~/bert_jax && make tpu-data-local $(TPU_DATA_VARS)"
endif

ifeq ($(RUNNER),local)
RECORDS_CMD = $(PY) -m data_pipelines.create_pretraining_data
RECORDS_RUN = --num_workers=$(DATA_WORKERS)
else ifeq ($(RUNNER),direct)
RECORDS_CMD = $(BEAM_PY) -m data_pipelines.beam_records
RECORDS_RUN = --runner=DirectRunner --direct_num_workers=$(DATA_WORKERS) \
	--direct_running_mode=multi_processing --tfds_parts=$(TFDS_PARTS)
else
RECORDS_CMD = $(BEAM_PY) -m data_pipelines.beam_records
RECORDS_RUN = --runner=DataflowRunner --project=$(PROJECT) --region=$(DATAFLOW_REGION) \
	--temp_location=$(BUCKET)/dataflow/tmp --staging_location=$(BUCKET)/dataflow/staging \
	--sdk_container_image=$(BEAM_IMAGE) --sdk_location=container \
	--machine_type=$(DATAFLOW_MACHINE_TYPE) --max_num_workers=$(DATAFLOW_MAX_WORKERS) \
	--tfds_parts=$(TFDS_PARTS) $(if $(DATAFLOW_SUBMIT),,--dry_run)
endif
# Dataflow's workers write into the bucket; the local runners into TPU_LOCAL_DATA (rsync'ed).
RECORDS_DIR = $(if $(filter dataflow,$(RUNNER)),$(TPU_DATA_DIR),$(TPU_LOCAL_DATA))

# $(1) T, $(2) P, $(3) source tag, $(4) TFDS name, $(5) text feature, $(6) train|eval,
# $(7) TFDS split, $(8) dupe factor, $(9) shards, $(10) seed.
define tpu_records
	$(RECORDS_CMD) --input_file=tfds:$(4) \
		--tfds_text_key=$(5) --tfds_split='$(7)' $(if $(TFDS_DATA_DIR),--tfds_data_dir=$(TFDS_DATA_DIR)) \
		--output_file=$(RECORDS_DIR)/seq$(1)/$(6)-$(3).tfrecord --num_output_shards=$(9) \
		--vocab_file=$(TPU_LOCAL_DATA)/vocab.txt --do_lower_case --max_seq_length=$(1) \
		--max_predictions_per_seq=$(2) --dupe_factor=$(8) --random_seed=$(10) \
		$(RECORDS_RUN)

endef
# 1% of each source is held out for evaluation.
tpu_records_for = $(call tpu_records,$(1),$(2),wiki,$(WIKI_TFDS),text,train,train[:99%],$(DUPE_FACTOR),$(TRAIN_SHARDS),$(1)1)$(call tpu_records,$(1),$(2),books,$(BOOKS_TFDS),book_text,train,train[:99%],$(DUPE_FACTOR),$(TRAIN_SHARDS),$(1)2)$(call tpu_records,$(1),$(2),wiki,$(WIKI_TFDS),text,eval,train[99%:],1,4,$(1)3)$(call tpu_records,$(1),$(2),books,$(BOOKS_TFDS),book_text,eval,train[99%:],1,4,$(1)4)

tpu-data-local:  ## (runs where invoked) the records of tpu-data, then a copy into BUCKET
	$(if $(filter direct,$(RUNNER)),test -x $(BEAM_PY) || $(MAKE) --no-print-directory beam-venv)
	mkdir -p $(TPU_LOCAL_DATA)/seq128 $(TPU_LOCAL_DATA)/seq512
	curl -sSL -o $(TPU_LOCAL_DATA)/bert.zip $(VOCAB_URL)
	unzip -p $(TPU_LOCAL_DATA)/bert.zip '*/vocab.txt' > $(TPU_LOCAL_DATA)/vocab.txt
	$(call tpu_records_for,128,20)
	$(call tpu_records_for,512,80)
	gcloud storage rsync --recursive $(TPU_LOCAL_DATA) $(TPU_DATA_DIR)

tpu-pretrain:  ## run CONFIG:PHASE on every worker (resumes from TPU_WORKDIR if it has checkpoints)
	$(TPU_SSH) --worker=all --command="$(call tpu_on_workers,$(TPU_PRETRAIN_CMD),$(TPU_RUN_NAME))"

tpu-finetune:  ## fine-tune FINETUNE_CONFIG from the run INIT_FROM (single-host slice, e.g. v3-8)
	$(TPU_SSH) --worker=all --command="$(TPU_FINETUNE_REMOTE)"

tpu-ssh:  ## an interactive shell on worker 0
	$(TPU_SSH) --worker=0

tpu-logs:  ## follow the run's log on worker 0 (process 0 writes the metrics)
	$(TPU_SSH) --worker=0 --command="tail -n 200 -f ~/logs/$(TPU_RUN_NAME).log"

tpu-delete:  ## delete the TPU VM slice (the bucket keeps data and checkpoints)
	$(TPU_VM) delete $(TPU_NAME) $(TPU_FLAGS) --quiet

tpu-qr-create:  ## request a spot slice as a queued resource (granted when capacity frees up)
	$(TPU_QR) create $(TPU_QUEUED_RESOURCE) $(TPU_FLAGS) $(TPU_QR_SLICE) --spot

tpu-qr-status:  ## the queued resource's state (WAITING_FOR_RESOURCES, ACTIVE, SUSPENDED, ...)
	$(TPU_QR) describe $(TPU_QUEUED_RESOURCE) $(TPU_FLAGS) --format='value(state.state)'

tpu-qr-delete:  ## delete the queued resource and its slice
	$(TPU_QR) delete $(TPU_QUEUED_RESOURCE) $(TPU_FLAGS) --force --quiet

tpu-spot-pretrain:  ## spot capacity: (re)create, set up and run until CONFIG:PHASE completes
	MAKE='$(MAKE)' bash experiments/tpu_spot_loop.sh

aot-check:  ## compile every TPU config for its slice on this CPU and check it fits
	$(PY) -c 'import libtpu' 2>/dev/null || $(PY) -m pip install --quiet -e '.[tpu]'
	status=0; for c in $(AOT_CONFIGS); do \
		$(PY) -m experiments.aot_compile --config=experiments/configs/$$c $(AOT_ARGS) \
			|| status=1; \
	done; exit $$status
