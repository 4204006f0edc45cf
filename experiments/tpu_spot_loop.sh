#!/usr/bin/env bash
# Runs one pretraining phase to completion on spot TPU capacity (`make tpu-spot-pretrain`).
#
# Spot slices are taken back at any time. A preempted queued resource is deleted and
# requested again; once granted, the project is installed and the run relaunched, and
# `experiments.pretrain` resumes from the newest checkpoint in its gs:// workdir (on
# SIGTERM it saves one before the VM goes). Every gcloud call goes through the tpu-*
# make targets, so the same variables (PROJECT ZONE TPU_NAME BUCKET CONFIG PHASE ...)
# apply. A run that fails while its slice is still ACTIVE is a real error: after
# MAX_FAILURES of those in a row the loop gives up rather than retrying forever.
set -u -o pipefail

MAKE=${MAKE:-make}
POLL_SECONDS=${POLL_SECONDS:-60}
MAX_FAILURES=${MAX_FAILURES:-3}
failures=0

state() {
  # Empty when the queued resource does not exist (yet, or any more).
  $MAKE -s --no-print-directory tpu-qr-status 2>/dev/null | tail -n 1
}

while true; do
  current=$(state)
  echo "[spot] queued resource state: ${current:-NOT_FOUND}"
  case "$current" in
    "")
      $MAKE tpu-qr-create || sleep "$POLL_SECONDS"
      ;;
    ACTIVE)
      if $MAKE tpu-setup && $MAKE tpu-pretrain FOREGROUND=1; then
        echo "[spot] the run finished"
        exit 0
      fi
      if [ "$(state)" = ACTIVE ]; then
        failures=$((failures + 1))
        echo "[spot] the run failed on a live slice ($failures/$MAX_FAILURES)"
        if [ "$failures" -ge "$MAX_FAILURES" ]; then
          echo "[spot] giving up: see 'make tpu-logs' and the run's metrics" >&2
          exit 1
        fi
      else
        failures=0
        echo "[spot] the slice was preempted: the next run resumes from the last checkpoint"
      fi
      ;;
    SUSPENDED | SUSPENDING | FAILED)
      # A preempted spot slice does not come back: free the request and queue a new one.
      $MAKE tpu-qr-delete
      ;;
    *)
      # ACCEPTED, WAITING_FOR_RESOURCES, PROVISIONING, CREATING, DELETING, ...
      sleep "$POLL_SECONDS"
      ;;
  esac
done
