"""One process of a multi-host run, started from a command line: the flags every multi-host
entry point takes (`define_flags`: `experiments.pretrain`, `experiments.finetune_embeddings`)
and the `jax.distributed` start they ask for (`start`), before JAX's backend starts.

On Cloud TPU VMs `--distributed` alone: every worker of the slice runs the same command and
`jax.distributed.initialize()` finds its peers. Elsewhere `--coordinator_address` (host:port
of process 0), `--num_processes` and `--process_id`; CPU processes then reduce over gloo,
and a loopback coordinator address is also the one process 0's coordinator listens on.
"""

from __future__ import annotations

import ipaddress
import socket

from absl import flags

# The flags `define_flags` defines are the calling tool's own: its --help lists them.
flags.disclaim_key_flags()


def define_flags() -> None:
    """Defines --distributed, --coordinator_address, --num_processes and --process_id."""
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host off TPU).")
    flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host off TPU).")
    flags.DEFINE_integer("process_id", None, "This process's index (multi-host off TPU).")
    flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (Cloud TPU pods).")


def requested(flag_values) -> bool:
    """Whether the flags ask for a multi-process run."""
    return bool(flag_values.coordinator_address or flag_values.distributed)


def check_or_exit(flag_values, tool: str) -> None:
    """Exits with one line naming the flags when they do not describe one process of a run:
    --coordinator_address without --num_processes and --process_id, a --process_id outside
    [0, --num_processes), or either of those two without --coordinator_address or
    --distributed (where they would be ignored)."""
    count, index = flag_values.num_processes, flag_values.process_id
    if flag_values.coordinator_address and (count is None or index is None):
        raise SystemExit(f"{tool}: --coordinator_address needs --num_processes and --process_id "
                         "(this process's index, 0 on the coordinator's host)")  # fmt: skip
    if (count is not None or index is not None) and not requested(flag_values):
        raise SystemExit(f"{tool}: --num_processes and --process_id start a multi-process "
                         "run only with --coordinator_address (or --distributed on Cloud "
                         "TPU)")  # fmt: skip
    if count is not None and count < 1:
        raise SystemExit(f"{tool}: --num_processes={count}: at least 1")
    if index is not None and (index < 0 or (count is not None and index >= count)):
        raise SystemExit(f"{tool}: --process_id={index}: from 0 to --num_processes - 1")


def start(flag_values) -> bool:
    """`initialize` with the flags' values when they ask for a multi-process run (call
    `check_or_exit` first); whether they did."""
    if not requested(flag_values):
        return False
    initialize(flag_values.coordinator_address, flag_values.num_processes,
               flag_values.process_id)  # fmt: skip
    return True


def initialize(
    coordinator_address: str | None, num_processes: int | None, process_id: int | None
) -> None:
    """`jax.distributed.initialize` before the backend starts: all None on a Cloud TPU pod
    (found by JAX); with an address, gloo gives CPU processes their collectives (no effect
    on other platforms)."""
    import jax

    if coordinator_address:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=loopback_bind_address(coordinator_address),
    )


def loopback_bind_address(coordinator_address: str | None) -> str | None:
    """`coordinator_address` when its host is a loopback address (localhost, 127.0.0.1,
    [::1]), where process 0's coordinator then listens; None otherwise (JAX's default: every
    interface, which the other hosts of a multi-host run need)."""
    if not coordinator_address:
        return None
    host = coordinator_address.rsplit(":", 1)[0].strip("[]")
    try:
        found = socket.getaddrinfo(host, None)
    except OSError:
        return None
    addresses = {info[4][0] for info in found}
    if addresses and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        return coordinator_address
    return None
