"""The tools' one way to report bad input (``tasks.runtime.cli.command_line``): every user-error type derives from
``backbones.errors.UserError``, and no tool catches its own list of them."""

import re
from pathlib import Path

import pytest

from backbones.checkpoints.atomic import OutputError
from backbones.checkpoints.export import ExportError
from backbones.errors import CheckpointError, UserError
from tasks.config.keys import ConfigError
from tasks.data.checks import DataError, DataPathError
from tasks.deploy.images import InputError
from tasks.evaluation.dump import DumpPathError
from tasks.runtime.cli import command_line
from tasks.training.disk_space import DiskFullError
from tests._tools import REPO


@command_line
def _tool(argv=None, error=None):
    if error is not None:
        raise error
    return "done"


def test_a_user_error_ends_the_command_line_with_its_message_and_reaches_a_python_caller():
    assert _tool() == "done" and _tool([]) == "done"
    with pytest.raises(SystemExit) as exit_info:  # the command line: argv None
        _tool(None, ConfigError("config 'x.py' does not exist"))
    assert str(exit_info.value) == "error: config 'x.py' does not exist"  # no traceback, exit status 1
    with pytest.raises(ConfigError):  # from Python: the caller tells the kind
        _tool(["x.py"], ConfigError("config 'x.py' does not exist"))
    with pytest.raises(KeyError):  # not bad input: a bug, with its traceback
        _tool(None, KeyError("a"))


USER_ERRORS = {
    ConfigError: ValueError,
    CheckpointError: RuntimeError,
    ExportError: ValueError,
    OutputError: OSError,
    DataPathError: FileNotFoundError,
    DataError: RuntimeError,
    DumpPathError: ValueError,
    InputError: ValueError,
    DiskFullError: OSError,
}


@pytest.mark.parametrize("kind", USER_ERRORS, ids=lambda k: k.__name__)
def test_every_user_error_has_the_one_base_and_keeps_its_builtin_one(kind):
    assert issubclass(kind, UserError) and issubclass(kind, USER_ERRORS[kind])


def test_no_tool_catches_its_own_list_of_user_errors():
    names = {k.__name__ for k in USER_ERRORS}
    tools = sorted((Path(REPO) / "tools").glob("*.py"))
    lists = {
        p.name: caught
        for p in tools
        for caught in re.findall(r"except \(([^)]*)\)", p.read_text())
        if len(names & set(re.split(r",\s*", caught))) > 1
    }
    quirk = [p.name for p in tools if "if argv is not None:" in p.read_text()]
    assert len(tools) > 15 and lists == {} and quirk == [], "wrap main in tasks.runtime.cli.command_line instead"


# The tools whose main is not wrapped in command_line, and why; every other tool is.
OFF_THE_RUNNER = {
    "build_mmcv.py": "stdlib only: tools/setup_env.sh runs it before the project and its packages are installed",
    "compare_official.py": "runs with torch alone, and tasks/ (the runner's package) imports mmengine",
    "gpu_report.py": "runs with torch alone, and tasks/ (the runner's package) imports mmengine",
    "demo.py": "runs the other tools as __main__, each on the runner; it says which step failed and its message",
    "train.py": "its cli() names the failing rank of a DDP run for bad input and crashes alike (docs/reliability.md)",
}


def test_every_tool_is_on_the_runner_or_says_why_not():
    tools = {p.name: p.read_text() for p in (Path(REPO) / "tools").glob("*.py")}
    off = {name for name, text in tools.items() if "@command_line" not in text}
    assert off == set(OFF_THE_RUNNER), "wrap the tool's main in tasks.runtime.cli.command_line"
