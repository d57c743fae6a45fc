"""The training step of a config with its ``compile`` options against the same step eager, in one process.

    python -m perf.training.compile_step CONFIG --data-root DIR [--targets eager backbone model] [--steps 6]
        [--rounds 2] [--backend inductor] [--cfg-options KEY=VALUE ...]

Each round builds the config's model once per target (same seed, same weights, same batches): ``eager``,
``backbone`` (backbone and neck compiled in place, what the config's ``compile`` does: tasks/training/compile.py)
and ``model`` (the whole mm model's forward compiled, as close as a module gets to mmengine's compiled
``train_step``), then runs ``--steps`` training steps (forward in loss mode, backward, AdamW step) on the
config's first train batches. Printed per round and target: the first step (the compile) and the median of
the other steps, with both as ratios to eager of the same round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import backbones

TARGETS = ("eager", "backbone", "model")


def _batches(cfg, n: int) -> list:
    from tasks import build_task

    _, datamodule = build_task(cfg, init_weights=False)
    datamodule.setup("fit")
    loader = iter(datamodule.train_dataloader())
    return [next(loader) for _ in range(n)]


def run_target(cfg, target: str, batches: list, backend: str) -> list[float]:
    """Seconds of each training step of ``target`` over ``batches`` (the first one compiles)."""
    from tasks import build_task
    from tasks.training.compile import compile_model

    torch.manual_seed(0)
    module, _ = build_task(cfg, init_weights=True)
    model = module.model.train()
    backbones.set_fast_paths(True)  # eager as without `compile`; compile_model switches them off
    if target == "backbone":
        compile_model(model, dict(backend=backend))
    elif target == "model":
        backbones.set_fast_paths(False)
        model.compile(backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for batch in batches:
        start = time.perf_counter()
        data = model.data_preprocessor(batch, True)
        loss, _ = model.parse_losses(model(**data, mode="loss"))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    torch._dynamo.reset()  # the next build starts from no compiled code (inductor's disk cache stays)
    return times


def main(argv=None) -> None:
    """Print the rounds' first-step and steady-step times and their ratios to eager."""
    from tasks.config.load import add_cfg_options, load_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--data-root", required=True, help="the tiny dataset (tools/make_tiny_data.py's output)")
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--steps", type=int, default=6, help="training steps per target and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    add_cfg_options(parser)
    args = parser.parse_args(argv)
    options = {f"{s}_dataloader.dataset.data_root": args.data_root for s in ("train", "val", "test")}
    options.update({"train_dataloader.num_workers": 0, "train_dataloader.persistent_workers": False})
    cfg = load_config(args.config, {**options, **args.cfg_options})
    batches = _batches(cfg, args.steps)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, backend {args.backend}", flush=True)
    for r in range(args.rounds):
        eager = None
        for target in args.targets:
            times = run_target(cfg, target, batches, args.backend)
            first, steady = times[0], statistics.median(times[1:])
            if target == "eager":
                eager = (first, steady)
            ratios = f" | ratio first {first / eager[0]:.2f}, steady {steady / eager[1]:.2f}" if eager else ""
            print(f"round {r} {target:8s} first step {first:7.2f} s, steady {steady:6.3f} s/step{ratios}", flush=True)


if __name__ == "__main__":
    main()
