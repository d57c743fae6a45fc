#!/usr/bin/env python
"""The resolved config, as mmengine prints it (``Config.pretty_text``), after the project's own loading.

  python tools/print_config.py CONFIG [--cfg-options KEY=VALUE ...]

The config is read by ``tasks.config.load.load_config``, as tools/train.py and tools/test.py read it: the ``_base_`` /
``mmdet::`` / ``mmseg::`` inheritance resolved and the ``--cfg-options`` overrides applied.
"""

from __future__ import annotations

import argparse

from tasks.config.load import add_cfg_options, load_config
from tasks.runtime.cli import command_line


def resolved_text(config: str, cfg_options: dict | None = None) -> str:
    """The config at ``config`` with ``cfg_options`` applied, as mmengine's ``Config.pretty_text`` formats it.

    Args:
        config: path of an mmengine config.
        cfg_options: overrides already parsed by ``--cfg-options`` (``{key: literal}``).
    """
    return load_config(config, cfg_options).pretty_text


@command_line
def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="an mmengine config")
    add_cfg_options(p)
    args = p.parse_args(argv)
    text = resolved_text(args.config, args.cfg_options)
    print(text)
    return text


if __name__ == "__main__":
    main()
