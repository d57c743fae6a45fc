"""tests/test_toy_family.py's child process: every tool's ``main(argv)`` on the toy family, in turn, in one
process (the imports of mm, Lightning and timm cost seconds each), run from a copy of the repository whose
``backbones/`` holds the toy family as its own file:

    python -m tests._toy_driver CONFIG TINY_ADE20K OUT_DIR    (from the copy, PYTHONPATH=the copy)

Each step's outcome goes into ``OUT_DIR/steps.json``: {step: {"ok": what the step found} or {"error": the
exception}}; one step failing does not stop the others. The checks that need the toy family registered (loading
the exports, timm) run here; the test asserts on what they found."""

import contextlib
import io
import json
import os
import os.path as osp
import sys
import time
import traceback

import torch

from tests._tools import load_tool, warnings_as_errors

SIZE = (64, 96)  # the input of the forward comparisons


def _max_difference(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _backbone_outputs(model, x):
    with torch.no_grad():
        return [o.detach() for o in model.eval()(x)]


def run_steps(config: str, data_root: str, out: str) -> dict:
    from backbones import FAMILIES, create, load_pretrained
    from backbones.checkpoints.export import EXTENSIONS, FORMATS

    family = FAMILIES["toy"]
    steps, x = {}, torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(0))
    data = []
    for split in ("train", "val", "test"):
        data += [f"{split}_dataloader.dataset.data_root={data_root}/", f"{split}_dataloader.num_workers=0"]
    data += ["train_dataloader.batch_size=2", "trainer.enable_progress_bar=False", "trainer.enable_model_summary=False"]
    # 64 px crops of 128x64 images, validated and tested at 128x64 (tests/_runs.py's seg_opts, with evaluation)
    data += [
        "crop_size=(64,64)",
        "model.data_preprocessor.size=(64,64)",
        "train_dataloader.dataset.pipeline.2.scale=(128,64)",
        "train_dataloader.dataset.pipeline.3.crop_size=(64,64)",
        "val_dataloader.dataset.pipeline.1.scale=(128,64)",
        "test_dataloader.dataset.pipeline.1.scale=(128,64)",
    ]
    work_dir = osp.join(out, "work")
    ckpt = osp.join(work_dir, "last.ckpt")

    def step(name, fn):
        printed, start, cpu = io.StringIO(), time.perf_counter(), time.process_time()
        try:
            with contextlib.redirect_stdout(printed):
                steps[name] = dict(ok=fn())
        except BaseException as e:  # noqa: BLE001 - a SystemExit of argparse too: recorded, the next step runs
            steps[name] = dict(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        steps[name].update(printed=printed.getvalue()[-4000:], seconds=round(time.perf_counter() - start, 2))
        steps[name]["cpu_seconds"] = round(time.process_time() - cpu, 2)

    def print_config():
        return load_tool("print_config").main([config, "--cfg-options", *data])

    def train():
        opts = [*data, "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.log_every_n_steps=1"]
        return load_tool("train").main([config, "--work-dir", work_dir, "--cfg-options", *opts])

    def test():
        return load_tool("test").main([config, ckpt, "--work-dir", work_dir, "--cfg-options", *data])

    trained = {}

    def export(fmt):
        tool = load_tool("export_backbone")
        path = osp.join(out, f"toy_{fmt}{EXTENSIONS.get(fmt, ('',))[0]}")
        meta = tool.main([ckpt, "--out", path, "--format", fmt])
        if fmt == "onnx":
            import onnxruntime as ort

            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            outs = [torch.from_numpy(o) for o in session.run(None, {"image": x.numpy()})]
        elif fmt == "timm":
            import timm

            model = timm.create_model(f"local-dir:{path}", pretrained=True, features_only=True)
            outs = _backbone_outputs(model, x)
        else:
            model = create("toy", "shrunk")
            load_pretrained(model, path)
            outs = _backbone_outputs(model, x)
        trained.setdefault("outputs", outs)  # the first format's (pth): what the others must compute
        difference = _max_difference(outs, trained["outputs"])
        return dict(family=meta["family"], format=meta["format"], path=path, difference=difference)

    def export_release():
        # the family's official classification model, saved as its releases are downloaded: to timm with its head
        official = family.cls("one", head=True).eval()
        release, path = osp.join(out, "toy_one_release.pth"), osp.join(out, "toy_release_timm")
        torch.save({"model": official.state_dict()}, release)
        meta = load_tool("export_backbone").main([release, "--out", path, "--format", "timm"])
        import timm

        model = timm.create_model(f"local-dir:{path}", pretrained=True).eval()
        with torch.no_grad():
            expected = official.head(official(x)[-1].mean((2, 3)))
            difference = float((model(x) - expected).abs().max())
        return dict(family=meta["family"], variant=meta["variant"], difference=difference)

    def export_model():
        path = osp.join(out, "toy_model.pth")
        meta = load_tool("export_model").main([ckpt, "--out", path])
        sd = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        backbone = create("toy", "shrunk")
        backbone.load_state_dict({k[9:]: v for k, v in sd.items() if k.startswith("backbone.")})
        difference = _max_difference(_backbone_outputs(backbone, x), trained["outputs"])
        return dict(classes=list(meta["dataset_meta"]["classes"]), difference=difference, path=path)

    def get_flops():
        return load_tool("get_flops").main([config, "--shape", "64", "64"])

    def benchmark():
        rows = osp.join(out, "benchmark.json")
        argv = ["--family", "toy", "--arch", "shrunk", "--size", "64x64", "--no-memory", "--repeat", "1"]
        load_tool("benchmark").main([*argv, "--json", rows])
        with open(rows) as f:
            return json.load(f)

    def gpu_report():
        # every section, on the toy's rows (and Swin-T's): the other families' rows are tests/test_gpu_report.py's
        report = osp.join(out, "gpu_report.md")
        load_tool("gpu_report").main(["--device", "cpu", "--quick", "--families", "toy", "--out", report])
        with open(report) as f:
            return f.read()

    def visualize_attention():
        image = osp.join(data_root, "images", "validation")
        image = osp.join(image, sorted(os.listdir(image))[0])
        return load_tool("visualize_attention").main([config, ckpt, image, "--out-dir", osp.join(out, "attention")])

    def timm_model():
        import timm

        names = timm.list_models("toy_*")
        model = timm.create_model(names[0], num_classes=3).eval()
        with torch.no_grad():
            logits = model(x)
        return dict(names=names, logits=list(logits.shape), pretrained_cfg=model.pretrained_cfg["architecture"])

    step("print_config", print_config)
    step("train", train)
    step("test", test)
    for fmt in FORMATS:
        step(f"export_backbone {fmt}", lambda fmt=fmt: export(fmt))
    step("export_backbone release", export_release)
    step("export_model", export_model)
    step("get_flops", get_flops)
    step("benchmark", benchmark)
    step("visualize_attention", visualize_attention)
    step("timm", timm_model)
    step("gpu_report", gpu_report)
    return dict(steps=steps, family=family.title, formats=list(FORMATS))


if __name__ == "__main__":
    config, data_root, out = sys.argv[1:]
    with warnings_as_errors():  # a normal run prints no warning
        result = run_steps(config, data_root, out)
    with open(osp.join(out, "steps.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
