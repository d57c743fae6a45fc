"""Every key of a config is honoured or refused: the check of ``tasks.config.load.load_config`` over the key table
(tasks/config/key_table.py), and the table rendered as docs/config_keys.md.

An mm config moved here must mean what it meant under mmengine's Runner, so a key nobody reads cannot pass in
silence: an unknown key stops the run naming it, the file and the closest valid keys (a misspelt
``optim_wraper`` would otherwise train with the base's optimizer); a refused key stops it naming the
alternative; a key ignored on purpose logs one line (rank zero, through Lightning's logger) when its value
differs from what mm's base configs give it, so that inheriting them prints nothing. A top-level name starting
with one underscore (``_my_scale``) is the user's own config variable: mmengine keeps it, nothing reads it.

    python -m tasks.config.keys --markdown   # prints docs/config_keys.md
"""

from __future__ import annotations

import argparse
import difflib
import inspect
from collections.abc import Iterator, Mapping

from backbones import FAMILIES
from backbones.errors import UserError

from ..runtime.rank_zero import rank_zero_info
from .key_table import ANY, HONOURED, IGNORED, KEYS, REFUSED, VARIABLE, Key
from .variables import FAMILY_VARIABLES


class ConfigError(UserError, ValueError):
    """A config that cannot be read, is not one of this project's tasks, or holds a key that is unknown, refused or
    wrong; the message names the file, the key and the fix. The tools print it without a traceback."""


SECTIONS = ("train_cfg", "default_hooks", "env_cfg", "randomness", "auto_scale_lr", "optim_wrapper", "param_scheduler")
STATUSES = (HONOURED, REFUSED, IGNORED, VARIABLE)
# What mmengine's DefaultOptimWrapperConstructor reads of ``paramwise_cfg`` (with ``.get``: nothing else is read)
# and of each ``custom_keys`` entry.
PARAMWISE_KEYS = frozenset(
    "custom_keys bias_lr_mult bias_decay_mult norm_decay_mult dwconv_decay_mult flat_decay_mult bypass_duplicate "
    "dcn_offset_lr_mult".split()
)
CUSTOM_KEY_OPTIONS = frozenset({"lr_mult", "decay_mult"})
# torch.optim.lr_scheduler / mmengine scheduler arguments every entry may not repeat: the optimizer is ours.
_NOT_SCHEDULER_ARGS = {"self", "optimizer", "param_name", "args", "kwargs"}


def keys_of(section: str) -> dict[str, Key]:
    """The table's keys of ``section`` (``''``: the top level), those of every section (``_scope_``) included."""
    return {k.name: k for k in KEYS if k.section in (section, "*")}


def key_of(section: str, name: str) -> Key | None:
    """The table's entry of key ``name`` in ``section`` (``''``: the top level), or None. A top-level name that starts
    with a registered family's name and ``_`` is that family's config variable (``FAMILY_VARIABLES``)."""
    key = keys_of(section).get(name)
    if key is None and section == "" and any(name.startswith(f"{family}_") for family in FAMILIES):
        key = keys_of("")[FAMILY_VARIABLES]
    return key


def _is_quiet(key: Key, value) -> bool:
    if key.quiet == ANY:
        return True
    if callable(key.quiet):
        return key.quiet(value)
    return any(_plain(value) == q for q in key.quiet)


def _plain(value):
    """ConfigDict / tuple values compared as plain dicts / lists (a base's tuple and a loaded list are equal),
    without the ``_scope_`` that inheriting through ``mmdet::`` adds."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if k != "_scope_"}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _unknown(where: str, name: str, valid, path: str, extra: str = "") -> ConfigError:
    near = difflib.get_close_matches(name, sorted(valid), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    return ConfigError(
        f"{path}: unknown config key {where}{name!r}: nothing in this project reads it.{hint}{extra} "
        "The keys and what each does: docs/config_keys.md."
    )


def _scheduler_args(scheduler_type: str, scope: str | None) -> set[str] | None:
    """The arguments the scheduler class takes (its ``__init__`` over the MRO: mmengine's LR mixins pass
    ``*args`` on); None when the type is not registered (the build then names it)."""
    from mmengine.registry import PARAM_SCHEDULERS

    cls = PARAM_SCHEDULERS.get(scheduler_type)
    if cls is None and scope:
        from .scopes import register_scope

        register_scope(scope)  # mmdet's / mmseg's own schedulers (e.g. PolyLRRatio) register on import
        cls = PARAM_SCHEDULERS.get(f"{scope}.{scheduler_type}")
    if cls is None:
        return None
    names = set()
    for klass in inspect.getmro(cls):
        if "__init__" in vars(klass):
            names |= set(inspect.signature(klass.__init__).parameters)
    return names - _NOT_SCHEDULER_ARGS


def _entries(cfg) -> Iterator[tuple[str, str, object]]:
    """(where, name, value) for every top-level key and every key of the checked sections."""
    for name, value in cfg.items():
        yield "", name, value
    for section in SECTIONS[:-1]:
        value = cfg.get(section)
        if isinstance(value, Mapping):
            for name, sub in value.items():
                yield f"{section}.", name, sub


def check_keys(cfg, path: str, overridden=(), lengths: bool = True) -> None:
    """Refuse unknown and refused keys of a loaded config; log the ignored ones set to a non-default value.

    Args:
        cfg: the mmengine ``Config`` (after ``--cfg-options``).
        path: the config file, for the messages.
        overridden: the keys set on the command line (``--cfg-options``): a trainer value given there is the
            user's choice, not a section that overrides their ``train_cfg`` unseen.
        lengths: log the ``train_cfg`` lengths and intervals the trainer section overrides (``_check_lengths``);
            off where the config is not read to train.

    Raises:
        ConfigError: an unknown key (with the closest valid ones), a refused key set to a value mm's bases do not
            give it (with the alternative), or an invalid value of a checked key.
    """
    for where, name, value in _entries(cfg):
        if where == "" and name.startswith("_") and not name.startswith("__"):
            continue  # the user's own config variable
        key = key_of(where.rstrip("."), name)
        if key is None:
            extra = (
                " A config variable of your own (read only by the config itself) must start with one "
                "underscore, e.g. '_" + name + "'."
                if where == ""
                else ""
            )
            raise _unknown(where, name, set(keys_of(where.rstrip("."))) - {FAMILY_VARIABLES}, path, extra)
        if key.status == REFUSED and not _is_quiet(key, value):
            raise ConfigError(f"{path}: {where}{name}={value!r} is not supported here: {key.note}.")
        if key.status == IGNORED and not _is_quiet(key, value):
            rank_zero_info(f"{path}: {where}{name} is ignored: {key.note}.")
    _check_values(cfg, path, overridden, lengths)


def _check_values(cfg, path: str, overridden=(), lengths: bool = True) -> None:
    """The keys whose value picks a behaviour: the train loop's type, the logger hook's options, and each
    ``param_scheduler`` entry's keys (against its class's arguments)."""
    loop = (cfg.get("train_cfg") or {}).get("type")
    if loop not in (None, "EpochBasedTrainLoop", "IterBasedTrainLoop"):
        raise ConfigError(
            f"{path}: train_cfg.type={loop!r} is not supported here: Lightning runs the loop, with "
            "EpochBasedTrainLoop's max_epochs or IterBasedTrainLoop's max_iters."
        )
    if lengths:
        _check_lengths(cfg, path, overridden)
    auto = cfg.get("auto_scale_lr") or {}
    base = auto.get("base_batch_size")
    if auto.get("enable") and (not isinstance(base, int) or isinstance(base, bool) or base <= 0):
        raise ConfigError(
            f"{path}: auto_scale_lr.enable=True needs auto_scale_lr.base_batch_size, the total batch size (GPUs x "
            f"images per GPU x accumulation) the config's lr was set for, e.g. auto_scale_lr.base_batch_size=16 for "
            f"mmdet's COCO schedules; got {base!r}"
        )
    _check_paramwise(cfg.get("optim_wrapper") or {}, path)
    logger = (cfg.get("default_hooks") or {}).get("logger") or {}
    others = sorted(set(logger) - {"type", "_scope_", "interval", "log_metric_by_epoch"})
    if others:
        rank_zero_info(f"{path}: default_hooks.logger {others} are ignored: the loggers' options are `loggers`'.")
    schedulers = cfg.get("param_scheduler") or []
    for i, entry in enumerate([schedulers] if isinstance(schedulers, Mapping) else schedulers):
        table = keys_of("param_scheduler")
        args = _scheduler_args(entry.get("type"), cfg.get("default_scope")) if "type" in entry else None
        valid = set(table) - {"*"} | (args or set())
        for name in entry:
            if args is not None and name not in valid:
                raise _unknown(f"param_scheduler[{i}] ({entry['type']}) ", name, valid, path)


def _check_paramwise(optim_wrapper: Mapping, path: str) -> None:
    """The ``paramwise_cfg`` keys of mmengine's default constructor (another ``constructor`` reads its own)."""
    if optim_wrapper.get("constructor", "DefaultOptimWrapperConstructor") != "DefaultOptimWrapperConstructor":
        return
    paramwise = optim_wrapper.get("paramwise_cfg") or {}
    for name in paramwise:
        if name not in PARAMWISE_KEYS | {"_scope_"}:
            raise _unknown("optim_wrapper.paramwise_cfg.", name, PARAMWISE_KEYS, path)
    for pattern, options in (paramwise.get("custom_keys") or {}).items():
        for name in options if isinstance(options, Mapping) else ():
            if name not in CUSTOM_KEY_OPTIONS:
                raise _unknown(f"optim_wrapper.paramwise_cfg.custom_keys[{pattern!r}].", name, CUSTOM_KEY_OPTIONS, path)


def _check_lengths(cfg, path: str, overridden=()) -> None:
    """A ``train_cfg`` length or interval that the trainer section overrides (it sets ``max_epochs`` /
    ``max_steps``, so ``train_cfg`` is not read) logs one line naming both, when they differ; so does a
    ``default_hooks.logger.interval`` other than mm's 50 that ``trainer.log_every_n_steps`` overrides. Trainer
    values set on the command line (``overridden``) are the user's choice and pass."""
    trainer, train_cfg = cfg.get("trainer") or {}, cfg.get("train_cfg") or {}
    interval = ((cfg.get("default_hooks") or {}).get("logger") or {}).get("interval")
    chosen = {key.removeprefix("trainer.") for key in overridden if key.startswith("trainer.")}
    if "trainer" in overridden:
        return
    if (
        interval not in (None, 50)  # 50: mm's bases
        and "log_every_n_steps" not in chosen
        and trainer.get("log_every_n_steps", interval) != interval
    ):
        rank_zero_info(
            f"{path}: default_hooks.logger.interval={interval!r} is not used: the trainer section sets "
            f"trainer.log_every_n_steps={trainer['log_every_n_steps']!r}; set trainer.log_every_n_steps instead"
        )
    if "max_epochs" not in trainer and "max_steps" not in trainer:
        return
    interval = "val_check_interval" if "max_iters" in train_cfg else "check_val_every_n_epoch"
    for mm_key, key in (("max_iters", "max_steps"), ("max_epochs", "max_epochs"), ("val_interval", interval)):
        if mm_key in train_cfg and trainer.get(key) != train_cfg[mm_key] and key not in chosen:
            rank_zero_info(
                f"{path}: train_cfg.{mm_key}={train_cfg[mm_key]!r} is not used: the trainer section sets the run's "
                f"length (trainer.{key}={trainer.get(key)!r}); set trainer.{key} instead"
            )


def markdown() -> str:
    """The key table as the Markdown page docs/config_keys.md (one table per section)."""
    lines = [
        "# Config keys",
        "",
        "[Back to training](training.md) · [README](../README.md)",
        "",
        "What this project does with each key of an mmdet / mmseg config: the keys that mmdet 3.3's and mmseg "
        "1.2's base configs and this project's configs use. Every key read when a config is loaded "
        "(`tasks.config.load.load_config`, so by every tool) is one of these:",
        "",
        f"- **{HONOURED}**: mapped to what the note says;",
        f"- **{REFUSED}**: stops the run with the alternative (the values in *quiet* pass: mm's own defaults);",
        f"- **{IGNORED}**: one log line naming the key and why, but only when the value differs from the ones in "
        "*quiet* (what mm's base configs give it), so that inheriting a base config prints nothing;",
        f"- **{VARIABLE}**: a name a config file defines to write its sections with; nothing else reads it.",
        "",
        "Any other top-level key stops the run, naming the key, the file and the closest valid keys (a misspelt "
        "`optim_wraper` would otherwise be read by nothing). Your own config variables start with one "
        "underscore (`_my_scale = (1333, 800)`): mmengine keeps them, the check passes them. Unknown keys inside "
        "`train_cfg`, `default_hooks`, `env_cfg`, `randomness`, `auto_scale_lr`, `optim_wrapper` and each "
        "`param_scheduler` entry (against the "
        "scheduler class's arguments) stop the run too, and so do those of `optim_wrapper.paramwise_cfg` under "
        "mmengine's default constructor (what it reads: `custom_keys` with `lr_mult` / `decay_mult`, "
        "`bias_lr_mult`, `bias_decay_mult`, `norm_decay_mult`, `dwconv_decay_mult`, `flat_decay_mult`, "
        "`bypass_duplicate`, `dcn_offset_lr_mult`). The table is `tasks/config/key_table.py`; this page is "
        "its rendering (`python -m tasks.config.keys --markdown`).",
    ]
    titles = {"": "Top level", **{s: f"`{s}`" for s in SECTIONS}, "*": "Every section"}
    for section, title in titles.items():
        lines += ["", f"## {title}", "", "| key | status | what / why | quiet |", "|---|---|---|---|"]
        for key in sorted((k for k in KEYS if k.section == section), key=lambda k: (STATUSES.index(k.status), k.name)):
            lines.append(f"| `{key.name}` | {key.status} | {key.note} | {_quiet_text(key)} |")
    return "\n".join(lines) + "\n"


def _quiet_text(key: Key) -> str:
    if key.status not in (REFUSED, IGNORED):
        return ""
    if key.quiet == ANY:
        return "any value"
    if callable(key.quiet):
        return "the options mm's bases set"
    return ", ".join(f"`{q!r}`" for q in key.quiet) or "none"


def main(argv=None) -> None:
    """``python -m tasks.config.keys --markdown``: print docs/config_keys.md."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="print the key table as docs/config_keys.md")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(), end="")
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
