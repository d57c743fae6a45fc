"""tools/benchmark_loop.py at a tiny size: both loops (tools/train.py and mmengine's Runner) really train the demo
detection config in their own processes, marking each epoch's end, and the report holds every run and the
per-round figures computed from the marks. (Not the
speed ratio: too noisy on a shared machine; docs/benchmarks/ has the measured figures.)"""

import json
import math

import pytest

from tasks.data.tiny import make_coco
from tests._tools import load_tool

bench = load_tool("benchmark_loop")


# Two whole training processes (start-up ~15 s of CPU each): a minute or more on a loaded shared machine.
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_both_loops_train_and_the_report_adds_up(tmp_path):
    make_coco(tmp_path / "data", num_train=4, num_val=1, seed=0)
    out = tmp_path / "report.json"
    argv = [
        "--data",
        str(tmp_path / "data" / "tiny_coco"),
        "--epochs",
        "1",
        "2",
        "--rounds",
        "1",
        "--threads",
        "1",
        "--warmup",
        "0",
    ]
    argv += ["--cfg-options", "trainer.log_every_n_steps=1"]  # one step per epoch here
    report = bench.main([*argv, "--work-dir", str(tmp_path / "runs"), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))

    assert report["epochs"] == [1, 2] and report["rounds"] == 1 and report["threads"] == 1
    assert report["warmup"] == []
    for loop in ("lightning", "runner"):
        (run,) = report["runs"][loop]
        assert run["epochs"] == 2 and run["round"] == 0
        assert math.isfinite(run["last_loss"]) and run["last_loss"] > 0, (loop, run)
        assert 0.2 < run["peak_gib"] < 4 and run["cpu_s"] > 0 and run["wall_s"] > 0
        # one mark per epoch, in order, the clocks and steps growing; the last one is the run's step count
        first, second = run["marks"]
        assert (first["epoch"], second["epoch"]) == (1, 2), (loop, run["marks"])
        assert 1 <= first["steps"] < second["steps"] == run["steps"], (loop, run["marks"])
        assert first["wall_s"] < second["wall_s"] and first["cpu_s"] < second["cpu_s"] <= run["cpu_s"]
        # the marks lie inside the process: an epoch takes less than the whole run
        assert second["wall_s"] - first["wall_s"] < run["wall_s"]
        for key, per_step in (("wall_s", "per_step_s"), ("cpu_s", "per_step_cpu_s")):
            assert report[per_step][loop][0] == pytest.approx(
                (second[key] - first[key]) / (second["steps"] - first["steps"])
            )
    # each loop wrote its own checkpoint and logs
    assert (tmp_path / "runs" / "0_lightning_2" / "last.ckpt").is_file()
    assert (tmp_path / "runs" / "0_runner_2" / "epoch_2.pth").is_file()
    assert list((tmp_path / "runs" / "0_runner_2").glob("*/vis_data/events.out.tfevents.*"))
    ratios = report["ratios"]
    assert ratios["time"][0] == pytest.approx(report["per_step_s"]["lightning"][0] / report["per_step_s"]["runner"][0])
    assert ratios["cpu_time"][0] == pytest.approx(
        report["per_step_cpu_s"]["lightning"][0] / report["per_step_cpu_s"]["runner"][0]
    )
    assert ratios["peak_memory"][0] == pytest.approx(
        report["runs"]["lightning"][0]["peak_gib"] / report["runs"]["runner"][0]["peak_gib"]
    )


def test_bad_arguments_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--data", str(tmp_path / "missing")])
    assert "make_tiny_data.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--data", str(tmp_path), "--epochs", "3", "2"])
    assert "0 < SHORT < LONG" in capsys.readouterr().err
