"""The Cloud TPU storage layout shared by the TPU configs (not an experiment itself).

Everything a TPU run reads or writes lives in one bucket, so that every worker of a
slice sees the same files and a preempted slice resumes from where it stopped:

  gs://BUCKET/wikibooks/vocab.txt               the WordPiece vocab
  gs://BUCKET/wikibooks/seq128/{train,eval}-*    phase-1 records (T=128, P=20)
  gs://BUCKET/wikibooks/seq512/{train,eval}-*    phase-2 records (T=512, P=80)
  gs://BUCKET/runs/<config>_<phase>/             --workdir: checkpoints/, metrics, TensorBoard

`tpu.mk` builds the same paths (`make tpu-data`, `make tpu-pretrain`); the paths are
FieldReferences on `config.bucket`, so `--config.bucket=gs://my-bucket` moves them all.
"""

import ml_collections

DEFAULT_BUCKET = "gs://YOUR_BUCKET"  # replaced on the command line by tpu.mk's BUCKET
DATA_SUBDIR = "wikibooks"  # tpu.mk's DATA_DIR is $(BUCKET)/wikibooks
RUNS_SUBDIR = "runs"  # tpu.mk's WORKDIR is $(BUCKET)/runs/$(RUN_NAME)


def run_dir(bucket, config_name: str, phase: str):
    """The workdir tpu.mk gives a run of `config_name` (file stem) in `phase`.

    `bucket` is a string or a FieldReference (then so is the result).
    """
    return bucket + f"/{RUNS_SUBDIR}/{config_name}_{phase}"


def on_cloud_tpu(
    config: ml_collections.ConfigDict, *, config_name: str, phase: str, topology: str
) -> ml_collections.ConfigDict:
    """Points `config`'s data and phase-1 checkpoints at the bucket; sets the slice.

    `config_name` is the config file's stem (the run name tpu.mk uses); `topology` the
    slice the config is sized for, as `jax.experimental.topologies` names it.
    """
    config.topology = topology  # the slice it is sized for (aot-check's, tpu.mk's default)
    config.bucket = DEFAULT_BUCKET  # gs:// root of data and runs (tpu.mk passes BUCKET)
    bucket = config.get_ref("bucket")
    config.data_dir = bucket + f"/{DATA_SUBDIR}"
    if config.resume_from:  # phase 2 continues phase 1's run in the same bucket
        config.resume_from = run_dir(bucket, config_name, "phase1") + "/checkpoints"
    config.model.scan_layers = True  # one compiled layer body: minutes less to compile
    return config
