"""Config loading shared by the tools that read a config (``--cfg-options`` parsing included), and the config
text stored in checkpoints."""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import os.path as osp
import pprint
import re
from typing import Any

from mmengine.config import Config, DictAction
from mmengine.registry import Registry

from .keys import ConfigError, check_keys
from .scopes import SCOPES

CFG_OPTIONS_HELP = "override config keys (values parsed as literals)"
CONFIG_SUFFIXES = (".py", ".json", ".yaml", ".yml")  # what mmengine's Config.fromfile reads


def check_config_path(path: str | os.PathLike) -> None:
    """Raise a ``ConfigError`` unless ``path`` is a config file mmengine reads (before mmengine's parser, whose
    errors come from deep inside it or, for a folder, call it missing).

    Args:
        path: the config argument of a tool.
    """
    path = os.fspath(path)
    if osp.isdir(path):
        raise ConfigError(
            f"config {path!r} is a folder: give the config file (a work dir of tools/train.py holds the run's "
            "resolved config as <config name>.py)"
        )
    if not osp.isfile(path):
        raise ConfigError(
            f"config file not found: {path!r} (relative paths are resolved from {os.getcwd()!r}); check the path"
        )
    if not path.endswith(CONFIG_SUFFIXES):
        raise ConfigError(
            f"{path!r} is not an mmengine config (a {' / '.join(CONFIG_SUFFIXES)} file); did you swap the config "
            "and another argument?"
        )


# A value holding a dict: ``dict(`` anywhere, or ``{`` first (after the brackets of a list / tuple).
_DICT_VALUE = re.compile(r"dict\s*\(|^[\s\[\(]*\{")


class _CfgOptionsAction(DictAction):
    """mmengine's ``DictAction``, refusing dict values by name: it parses numbers, strings, lists and tuples, and
    turned ``dict(a=1, b=2)`` into a RecursionError deep inside mmengine, ``dict(a=1)`` into a string and
    ``{'a': 1}`` into a list of strings, each failing later far from the option."""

    def __call__(self, parser, namespace, values, option_string=None):
        for option in values:
            key, _, value = option.partition("=")
            if _DICT_VALUE.search(value):
                parser.error(
                    f"{option_string} {option}: a dict value cannot be given on the command line (mmengine's "
                    f"--cfg-options parses numbers, strings, lists and tuples); set each of its keys instead, "
                    f"{key}.KEY=VALUE (e.g. randomness.seed=1 randomness.deterministic=True), or write the "
                    "dict in a config file of your own whose _base_ is this one"
                )
        super().__call__(parser, namespace, values, option_string)


def add_cfg_options(parser: argparse.ArgumentParser, help: str = CFG_OPTIONS_HELP) -> None:
    """``--cfg-options KEY=VALUE ...`` on a command line (the tools that read a config): mmengine's
    ``DictAction`` parses the values to literals (a dict value is refused, naming the dotted keys to set
    instead); ``load_config`` applies them.

    Args:
        parser: the tool's argument parser.
        help: the option's help text.
    """
    parser.add_argument(
        "--cfg-options", nargs="+", action=_CfgOptionsAction, default={}, metavar="KEY=VALUE", help=help
    )


def torch_device(value: str) -> str:
    """``--device`` of the tools (an argparse ``type``): ``value`` if torch names a device by it and that device is
    here, else an ``argparse.ArgumentTypeError`` saying what to give (argparse prints it with the usage).

    Args:
        value: e.g. ``'cpu'``, ``'cuda'``, ``'cuda:1'``.
    """
    import torch

    try:
        device = torch.device(value)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a torch device; give cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{value!r}: torch finds no CUDA device here; give cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{value!r}: there are {torch.cuda.device_count()} CUDA devices here")
    return value


def parse_cfg_options(options: list[str]) -> dict:
    """``KEY=VALUE`` strings (as after ``--cfg-options`` on a command line) parsed the way the tools parse them.

    Args:
        options: the ``KEY=VALUE`` strings; empty gives ``{}``.
    """
    parser = argparse.ArgumentParser(prog="--cfg-options")
    add_cfg_options(parser)
    return parser.parse_args(["--cfg-options", *options] if options else []).cfg_options


def load_config(path: str | os.PathLike, cfg_options: dict | None = None, *, training: bool = True) -> Config:
    """Read an mmengine config (``_base_`` / ``mmdet::`` inheritance, ``custom_imports``), apply
    ``--cfg-options`` overrides (already parsed to literals by mmengine's ``DictAction``) and check its keys
    against the key table (``tasks.config.keys.check_keys``: unknown and refused keys raise a ValueError). A path
    that is not a config file, or a config of neither task, raises a ``ConfigError``.

    Args:
        path: the config file.
        cfg_options: the parsed ``--cfg-options``.
        training: the config is read to train (or to show what training does): name the ``train_cfg`` lengths
            the trainer section overrides. False for tools that only evaluate, predict or draw with it (a run's
            saved config holds the command line's ``trainer.max_steps`` beside the base's ``train_cfg``).
    """
    check_config_path(path)
    cfg = Config.fromfile(os.fspath(path))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get("default_scope")
    if scope not in SCOPES:
        raise ConfigError(
            f"{path}: default_scope must be one of {SCOPES} (inherit an mmdet:: or mmseg:: base config), got {scope!r}"
        )
    check_keys(cfg, os.fspath(path), overridden=tuple(cfg_options or ()), lengths=training)
    return cfg


def config_text(cfg: Config) -> str:
    """The resolved config as Python source that ``Config.fromstring(text, '.py')`` reads back.

    One ``key = literal`` per top-level entry, formatted by pprint: ``Config.pretty_text`` runs yapf, which is
    slow on a whole detector config and would run at every checkpoint. Configs holding non-literal values
    (lazy-import configs) fall back to ``pretty_text``.
    Checkpoints store it (``mm_config``), and the export tools read it back as literals, never executing it.
    """
    lines = []
    for key, value in cfg.to_dict().items():
        text = pprint.pformat(value, width=110, sort_dicts=False)
        try:
            ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return cfg.pretty_text
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def default_work_dir(cfg: Config, config_path: str | os.PathLike) -> str:
    """``cfg.work_dir`` if set, else ``work_dirs/<config name>`` (mmengine's convention)."""
    return cfg.get("work_dir") or osp.join("work_dirs", osp.splitext(osp.basename(config_path))[0])


def _registry_names(registry) -> set[str]:
    """Names in ``registry``, its parents and their children (mmdet / mmseg / mmengine scopes)."""
    root = registry
    while root.parent is not None:
        root = root.parent
    names, todo = set(), [root]
    while todo:
        reg = todo.pop()
        names |= set(reg.module_dict)
        todo += list(reg.children.values())
    return names


def build_from_registry(registry: Registry, cfg: dict, what: str = "model") -> Any:
    """``registry.build(cfg)``; a ``type`` the registry does not know gets the closest registered names.

    Args:
        registry: the mm registry (e.g. mmdet's ``MODELS``).
        cfg: the config of the object, with its ``type``.
        what: what is built, for the error message.
    """
    try:
        return registry.build(cfg)
    except KeyError as e:
        m = re.search(r"'?([\w.:]+) is not in the ", str(e))
        if m is None:
            raise
        name = m.group(1).split(".")[-1]
        near = difflib.get_close_matches(name, _registry_names(registry), n=5, cutoff=0.6)
        near += sorted(n for n in _registry_names(registry) if n.lower() == name.lower() and n not in near)
        hint = f" Did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        raise KeyError(
            f"{what}: unknown type {name!r} (not registered in {registry.scope}'s {registry.name} "
            f"registry or its parents).{hint}"
        ) from e
