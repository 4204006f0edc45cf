"""How every `python -m <package>.<tool>` runs: absl's `app.run`, with two fixes.

- `--help`, `-h`, `-?`, `--helpshort` and `--helpfull` print the help and exit 0 (absl exits 1,
  and has no `-h`); scripts that probe a tool with `--help` expect success.
- A `--config.<key>=value` override naming no key of the config is one line naming the key
  and the closest valid keys, instead of the traceback ml_collections raises from inside
  flag parsing.
- An error about the user's input (a missing file, a vocabulary or task file that does not
  read, an output that is an input) is one line naming the tool, not a traceback.
- `check_same_flags`: a tool whose workdir outputs are reused on a rerun records the flags
  they depend on there, and refuses the workdir when a rerun changes them.
- A tool that starts tools (the demo's stages) stops them when it stops: `run_child` sends
  its child SIGTERM (a training stage checkpoints and stops) when the tool is interrupted
  while it waits, and `run(main, stop_on_sigterm=True)` makes SIGTERM such an interruption
  (by default SIGTERM kills the tool at once and its children train on: a rerun would then
  start a second writer into the same workdir).

It lives in `data_pipelines`, the package every other one may import.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable

from absl import app, flags


class _HelpFlag(app.HelpFlag):
    """`--help` / `-h`: the short help, exit 0."""

    SHORT_NAME = "h"

    def parse(self, arg):
        if self._parse(arg):
            app.usage(shorthelp=True, writeto_stdout=True)
            print(config_keys_help(sys.argv), end="")
            print("\nTry --helpfull to get a list of all flags.")
            sys.exit(0)


class _HelpshortFlag(_HelpFlag):
    """`--helpshort` / `-?` (absl's short name for help): the same."""

    NAME = "helpshort"
    SHORT_NAME = "?"


class _HelpfullFlag(app.HelpfullFlag):
    """`--helpfull`: every module's flags, exit 0."""

    def parse(self, arg):
        if self._parse(arg):
            app.usage(writeto_stdout=True)
            print(config_keys_help(sys.argv), end="")
            sys.exit(0)


# `config.key = value  # what it is`, or the comment lines just above the assignment.
_CONFIG_LINE = re.compile(r"^\s*config\.([\w.]+)\s*=[^#]*?(?:#\s*(.*))?$")


def _config_comments(paths: list[str]) -> dict[str, str]:
    """Each `config.<key>`'s comment in the config files `paths` (the first file that has one
    wins): the one beside the assignment, else the comment lines just above it."""
    comments: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        above: list[str] = []
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("#"):
                above.append(stripped.lstrip("#").strip())
                continue
            match = _CONFIG_LINE.match(line)
            if match and match.group(1) not in comments:
                text = match.group(2) or " ".join(above)
                if text:
                    comments[match.group(1)] = text
            above = []
    return comments


def _config_path(argv: list[str], name: str, default: str | None) -> str | None:
    """The value of `--<name>=...` / `--<name> ...` in `argv` (the last one), else `default`."""
    found = default
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            found = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            found = argv[i + 1]
    return found


def _configs_launching(script: str) -> list[str]:
    """The config files beside the tool `script` (`<its package>/configs/*.py`) whose docstring
    holds a command running it (`python -m <package>.<tool>`), relative to the working
    directory."""
    package = os.path.dirname(os.path.abspath(script))
    module = f"{os.path.basename(package)}.{os.path.splitext(os.path.basename(script))[0]}"
    command = re.compile(rf"-m\s+{re.escape(module)}\b")
    found = []
    configs = os.path.join(package, "configs")
    for entry in sorted(os.listdir(configs)) if os.path.isdir(configs) else []:
        path = os.path.join(configs, entry)
        if entry.endswith(".py") and not entry.startswith("_"):
            with open(path, encoding="utf-8") as f:
                if command.search(f.read()):
                    found.append(os.path.relpath(path))
    return found


def _flat(config, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in config.items():
        if hasattr(value, "items") and not isinstance(value, dict):  # a nested ConfigDict
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def config_keys_help(argv: list[str]) -> str:
    """The help's list of every key of each config-file flag (ml_collections'), with the
    value in its file and the comment beside it there: what `--config.<key>=value` can
    override. The file is the one named on the command line (`--config=<file>`, before or
    after `--help`), else the flag's default."""
    try:
        from ml_collections.config_flags.config_flags import ConfigFileFlagParser
    except ImportError:  # .venv-beam (beam_records' own) has none: no config flag there
        return ""

    out = []
    for name, flag in sorted(flags.FLAGS._flags().items()):  # noqa: SLF001 - absl's own map
        if name != flag.name or not isinstance(flag.parser, ConfigFileFlagParser):
            continue  # a short name, or not a config file flag
        path = _config_path(argv, name, flag.default)
        if not path:
            out.append(f"\n--{name}.<key>=value overrides a key of the --{name} file: give "
                       f"--{name}=<file> with --help to list its keys and defaults.\n")  # fmt: skip
            launching = _configs_launching(argv[0] if argv else "")
            if launching:
                out.append(f"Config files whose command runs this tool: {', '.join(launching)}\n")
            continue
        try:
            config = flag.parser.parse(path)
            items = _flat(config)
        except Exception as error:  # noqa: BLE001 - the help says why and goes on
            out.append(f"\n--{name}={path}: its keys cannot be listed ({error})\n")
            continue
        file = path.split(":", 1)[0]
        here = os.path.dirname(os.path.abspath(file))
        # The file's own comments, then those of the config modules it builds on.
        imported = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
        siblings = sorted({f for f in imported if f and os.path.dirname(f) == here} - {file})
        comments = _config_comments([file, *siblings])
        out.append(f"\n--{name}={path}: its keys (--{name}.<key>=value overrides one):\n")
        for key, value in items:
            shown = repr(value) if isinstance(value, str) or value is None else value
            comment = comments.get(key)
            out.append(f"  --{name}.{key}={shown}" + (f"  # {comment}" if comment else "") + "\n")
    return "".join(out)


def _define_help_flags() -> None:
    """Replaces absl's help flags by ours (absl's registration then finds them defined)."""
    if "help" in flags.FLAGS and isinstance(flags.FLAGS["help"], _HelpFlag):
        return
    app.define_help_flags()  # idempotent: app.run will not register absl's again
    for flag in (_HelpFlag(), _HelpshortFlag(), _HelpfullFlag()):
        old = flags.FLAGS[flag.name]
        for name in (old.name, old.short_name):
            if name and name in flags.FLAGS:  # absl deletes one name of a flag at a time
                delattr(flags.FLAGS, name)
        flags.DEFINE_flag(flag)


def run(main: Callable[[list[str]], object], *, stop_on_sigterm: bool = False) -> None:
    """`absl.app.run(main)` with a help that exits 0 and one-line config-key errors; with
    `stop_on_sigterm`, SIGTERM raises SystemExit(143) in `main` (its `finally` blocks and
    `run_child` stop what it started) instead of killing the process."""
    quiet_known_noise()
    _define_help_flags()
    if stop_on_sigterm:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    app.run(_input_errors_in_one_line(main), flags_parser=_parse_flags)


def quiet_known_noise() -> None:
    """Silences the start-up lines that every run printed and that say nothing about it, and
    only those, before TensorFlow or JAX load (every tool imports them after `run`):

    - TensorFlow's C++ INFO lines (the CPU features it was built without, no CUDA found):
      `TF_CPP_MIN_LOG_LEVEL=1` unless set, which drops INFO only; warnings and errors still
      print. "oneDNN custom operations are on" prints whatever that level, while oneDNN is
      on: `TF_ENABLE_ONEDNN_OPTS=0` unless set. TensorFlow only reads and masks the data
      here (parsing, integer ops, random draws, comparisons): none of it has a oneDNN kernel
      whose round-off differs (matmuls, convolutions, reductions), so nothing changes.
    - JAX's TPU probe where there is no TPU: libtpu's "Failed to find host bounds for
      accelerator type", "unexpected worker hostname ... TPU_WORKER_HOSTNAMES" where it is
      installed, and "Unable to initialize backend 'tpu': ... libtpu.so" where it is not
      (JAX registers its TPU backend either way). Where JAX's own hardware check finds no TPU
      chip and no GPU, and JAX_PLATFORMS is unset, JAX_PLATFORMS=cpu: the backend JAX falls
      back to there anyway. A TPU VM (TPU chips on its PCI bus, where a missing libtpu is
      worth its line) or a GPU machine is left as it is, and so is a JAX_PLATFORMS the user
      set (a backend named there that fails still fails loudly).

    Orbax's "Type handler registry ... overriding jax.Array" is our own override's warning:
    `bert_jax.checkpointing` silences it where it makes it.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    if "JAX_PLATFORMS" in os.environ or "JAX_FORCE_TPU_INIT" in os.environ:
        return
    hardware = _jax_hardware_utils()
    if hardware is None:
        return
    try:
        if hardware.num_available_tpu_chips_and_device_id()[0] or _has_gpu(hardware):
            return
    except Exception:  # noqa: BLE001 - cannot tell: leave JAX to probe
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:  # read at its import: too late for the variable
        sys.modules["jax"].config.update("jax_platforms", "cpu")


def _jax_hardware_utils():
    """JAX's `hardware_utils` (the checks it makes itself; only the standard library), loaded
    without importing JAX (seconds, which a tool that never uses JAX would pay); None
    where JAX is not installed or has no such file."""
    try:
        jax_spec = importlib.util.find_spec("jax")
    except (ImportError, ValueError):
        return None
    if jax_spec is None or not jax_spec.origin:
        return None
    path = os.path.join(os.path.dirname(jax_spec.origin), "_src", "hardware_utils.py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location("_jax_hardware_utils", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - another JAX's file: no check
        return None
    return module


def _has_gpu(hardware) -> bool:
    nvidia = hardware.has_visible_nvidia_gpu()
    amd = hasattr(hardware, "num_available_amd_gpus") and hardware.num_available_amd_gpus(1)
    return bool(nvidia or amd)


def progress_logging(*loggers: str) -> None:
    """A tool's own progress at INFO (the `loggers` named), absl's (Orbax's per-file INFO
    lines) at WARNING unless --verbosity was given."""
    import logging

    from absl import logging as absl_logging

    if not flags.FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    for name in loggers:
        logging.getLogger(name).setLevel(logging.INFO)


def _input_errors(error: BaseException) -> bool:
    """Whether `error` is about the user's input (a file that is not there or not a file, a
    vocabulary or task file that does not read), said in full by its message."""
    from data_pipelines.paths import GlobCharactersError, OutputIsInputError
    from data_pipelines.tasks.formats import TaskDataError
    from data_pipelines.tokenizer_base import VocabError

    kinds = (FileNotFoundError, IsADirectoryError, NotADirectoryError, VocabError,
             TaskDataError, OutputIsInputError, GlobCharactersError)  # fmt: skip
    return isinstance(error, kinds)


def _input_errors_in_one_line(main: Callable[[list[str]], object]):
    """`main`, where an input error (`_input_errors`) ends the tool with one line naming the
    tool and what is wrong, not a traceback: a missing vocab file reads as the other
    vocabulary errors do."""
    tool = os.path.splitext(os.path.basename(sys.argv[0] or "tool"))[0]

    def wrapped(argv):
        try:
            return main(argv)
        except Exception as error:  # noqa: BLE001 - re-raised unless it is the user's input
            if not _input_errors(error):
                raise
            raise SystemExit(f"{tool}: {error}") from None

    return wrapped


# --- tools that start tools ---------------------------------------------------------------

# Seconds a stopped child has to finish (a training stage writes its checkpoint) before it
# is killed.
STOP_GRACE_S = 120


def _exit_on_sigterm(signum, _frame):
    sys.stderr.write("SIGTERM: stopping, and the tools this one started first\n")
    raise SystemExit(128 + signum)


def stop(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to `process` if it still runs, then waits `grace_s` for it before SIGKILL."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def stops_with_this_process(process: subprocess.Popen):
    """A block after which `process` does not outlive an interruption of this one (an
    exception, Ctrl-C, SIGTERM under `run(..., stop_on_sigterm=True)`): `stop` runs before
    the exception goes on."""
    try:
        yield process
    except BaseException:
        stop(process)
        raise


def run_child(command: list[str], **popen_kwargs) -> int:
    """`subprocess.run(command).returncode`, except that an interrupted wait stops the child
    with SIGTERM (`stop`: a training child checkpoints) where subprocess.run kills it, so
    it neither loses its last steps nor leaves its own children running."""
    process = subprocess.Popen(command, **popen_kwargs)
    with stops_with_this_process(process):
        return process.wait()


def _parse_flags(argv: list[str]) -> list[str]:
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError, IndexError):
        # ml_collections raises these when an override names no key of the config.
        message = unknown_config_key(argv)
        if message is None:
            raise
        sys.stderr.write(f"FATAL Flags parsing error: {message}\n")
        sys.exit(1)


# --- config overrides ---------------------------------------------------------------------


_OVERRIDE = re.compile(r"^--?(?:no)?([A-Za-z_]\w*)\.([^=]+)")


def unknown_config_key(argv: list[str]) -> str | None:
    """The error for the first `--<config flag>.<path>` in `argv` naming no key, or None."""
    configs = {}
    for arg in argv[1:]:
        if arg == "--":
            break
        match = _OVERRIDE.match(arg)
        if not match or match.group(1) not in flags.FLAGS:
            continue
        name, path = match.groups()
        if name not in configs:
            configs[name] = _config_value(name, argv)
        config = configs[name]
        if config is None:
            continue
        missing = _missing_prefix(config, path.split("."))
        if missing is not None:
            return (
                f"--{name}.{path}: the config has no key {missing!r}; "
                f"{_suggest(config, name, path, missing)}"
            )
    return None


def _config_value(name: str, argv: list[str]):
    """The config of config flag `name` as loaded from `argv`, before any override."""
    flag = flags.FLAGS[name]
    args = argv[1:]
    for i, arg in enumerate(args):
        value = None
        if arg.startswith((f"--{name}=", f"-{name}=")):
            value = arg.split("=", 1)[1]
        elif arg in (f"--{name}", f"-{name}") and i + 1 < len(args):
            value = args[i + 1]
        if value is not None:
            try:
                return flag.parser.parse(value)
            except Exception:  # noqa: BLE001 - the config's own error surfaces elsewhere
                return None
    return flag.value if hasattr(flag.value, "keys") else None


def _missing_prefix(config, keys: list[str]) -> str | None:
    """The shortest prefix of `keys` (dotted) that does not exist in `config`, or None."""
    node = config
    for depth, key in enumerate(keys):
        if hasattr(node, "keys") and key in node:
            node = node[key]
        elif isinstance(node, (list, tuple)) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return ".".join(keys[: depth + 1])
    return None


def _paths(config, prefix: str = "") -> list[str]:
    """Every key of `config`, dotted, nested dicts included."""
    out = []
    for key in config.keys():
        path = f"{prefix}{key}"
        out.append(path)
        value = config[key]
        if hasattr(value, "keys"):
            out += _paths(value, f"{path}.")
    return out


def _suggest(config, name: str, path: str, missing: str) -> str:
    """'did you mean --config.a.b?' for the key paths whose last key is close to the given
    one (a misspelled key, or a right key at the wrong level), else the keys at that level."""
    paths = _paths(config)
    last = path.rsplit(".", 1)[-1]

    def similarity(candidate: str) -> float:
        return difflib.SequenceMatcher(None, last, candidate.rsplit(".", 1)[-1]).ratio()

    close = sorted((p for p in paths if similarity(p) >= 0.7), key=similarity, reverse=True)
    if close:
        return "did you mean " + " or ".join(f"--{name}.{c}" for c in close[:3]) + "?"
    parent = missing.rpartition(".")[0]
    level = sorted(p.rpartition(".")[2] for p in paths if p.rpartition(".")[0] == parent)
    return f"valid keys{f' in {parent!r}' if parent else ''}: {', '.join(level)}"


def check_same_flags(workdir: str, filename: str, current: dict) -> None:
    """Records `current` (flag name -> value) as `workdir/filename`, or, when a previous run
    recorded other values there, refuses the workdir: its outputs, made with those flags,
    would be reused as this run's. Raises app.UsageError naming each changed flag."""
    path = os.path.join(workdir, filename)
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(current, f, indent=2)
        return
    with open(path, encoding="utf-8") as f:
        previous = json.load(f)
    changed = {k: (previous.get(k), v) for k, v in current.items() if previous.get(k) != v}
    if changed:
        details = ", ".join(f"--{k}={old} (now {new})" for k, (old, new) in changed.items())
        raise app.UsageError(f"{workdir} was made with {details}; use another --workdir")
