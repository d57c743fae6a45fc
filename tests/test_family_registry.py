"""The family registry (backbones.families): a third family (the toy family of tests/data/toy.py) registered in
the test alone goes through the export (plain and official layout), the weight loading, the benchmark's model
builder (perf.models, the official-code adapter included), the attention maps and timm's registry without any
other file knowing it."""

import importlib.util
import json
import os.path as osp
import re
import types

import pytest
import torch
from torch import nn

import backbones
from backbones import FAMILIES, Family, create, family_of, load_pretrained, register
from backbones.checkpoints.export import ExportError, read_export, save_backbone, verify_export
from backbones.errors import CheckpointError
from backbones.families import unregister
from backbones.models.attention_maps import last_blocks, record_attention
from perf.models import build, ours_and_official
from perf.official import max_relative_difference
from tests._tools import REPO, load_tool, report_tables

TOY_FILE = osp.join(REPO, "tests", "data", "toy.py")  # the toy family: one file, as a contributor writes one
EXACT = "Exactness (fp32, TF32 off, batch 1, evaluation mode)"


def load_toy():
    """tests/data/toy.py as a module of its own: importing it registers the toy family (``unregister`` ends it)."""
    spec = importlib.util.spec_from_file_location("toy_family", TOY_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toy():
    """The toy family's module, its family registered for the test."""
    module = load_toy()
    yield module
    unregister("toy")


def test_registry_knows_both_families_by_model_state_dict_and_type_name():
    assert {"stvit", "hatnet"} <= set(FAMILIES)
    for name, family in FAMILIES.items():
        model = create(name, "shrunk")
        assert isinstance(model, family.cls) and family_of(model) is family
        assert family_of(model.state_dict()) is family
        assert backbones.families.by_type_name(f"mmdet.{family.type_name}") is family
        assert set(family.released) <= set(family.sizes) and "shrunk" in family.sizes
    assert family_of({"fc.weight": torch.zeros(1)}) is None
    with pytest.raises(KeyError, match="unknown backbone family 'nope'.*registered"):
        create("nope")


def test_a_taken_name_is_refused(toy):
    TOY = toy.FAMILY
    with pytest.raises(ValueError, match="registered already"):
        register(Family(**{**TOY.__dict__, "cls": nn.Identity}))
    with pytest.raises(ValueError, match="mm type name 'STViT'"):
        register(Family(**{**TOY.__dict__, "name": "toy2", "type_name": "STViT"}))


def test_a_third_family_exports_loads_benchmarks_and_records_attention(toy, tmp_path):
    module, toy = toy, toy.FAMILY
    model = create("toy", "one").eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        expected = model(x)
    assert family_of(model) is toy and family_of(model.state_dict()) is toy

    # export, plain and official layout, and back through load_pretrained into a fresh model
    for fmt in ("pth", "official"):
        path = tmp_path / f"toy.{fmt}.pth"
        meta = save_backbone(model.state_dict(), model, path, fmt)
        assert meta["family"] == "toy" and verify_export(path)["sha256"] == meta["sha256"]
        sd, _ = read_export(path)
        assert ("head.weight" in sd) == (fmt == "official")
        fresh = create("toy", "one").eval()
        report = load_pretrained(fresh, path)
        assert report.skipped == (["head.bias", "head.weight"] if fmt == "official" else [])
        with torch.no_grad():
            for a, b in zip(fresh(x), expected):
                torch.testing.assert_close(a, b, rtol=0, atol=0)

    # an mm config's backbone: the adapter made from the record, loading the export through init_cfg
    from mmengine.registry import MODELS

    cfg = dict(
        type=toy.type_name, arch="one", init_cfg=dict(type="Pretrained", checkpoint=str(tmp_path / "toy.pth.pth"))
    )
    mm_model = MODELS.build(cfg)
    mm_model.init_weights()
    assert type(mm_model).__name__ == f"MM{toy.cls.__name__}"
    with torch.no_grad():
        for a, b in zip(mm_model.eval()(x), expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

    # the benchmark's builder: ours, the plain-path reference, and the official code carrying the same weights;
    # another family's option is refused by name
    for name in ("ours", "reference"):
        with torch.no_grad():
            outs = build(name, "toy", "shrunk").eval()(x)
        assert [o.shape[1] for o in outs] == [8, 16, 32, 64]
        with pytest.raises(ValueError, match=r"Toy takes no option stoken_size; its own options: none"):
            build(name, "toy", "shrunk", {"stoken_size": [2, 2, 1, 1]})
    # the "official code": a module defining ToyNet and its variant builder toy_one
    official_code = types.SimpleNamespace(ToyNet=module.ToyNet, toy_one=lambda: module.ToyNet("one", head=True))
    ours, official = ours_and_official(official_code, "toy", "one")
    with torch.no_grad():
        assert max_relative_difference(official.eval()(x), ours.eval()(x)) == 0.0

    # attention maps through the family's probe points
    with record_attention(model, last_blocks(model)) as records:
        with torch.no_grad():
            model(x)
    assert sorted(records) == [(0, 0), (1, 0), (2, 1), (3, 0)]
    assert records[(1, 0)]["size"] == (8, 12)
    torch.testing.assert_close(records[(1, 0)]["weights"].sum((1, 2)), torch.ones(1))


def test_official_and_timm_formats_are_refused_for_a_family_without_their_records(toy, tmp_path):
    register_without = Family(**{**toy.FAMILY.__dict__, "official": None, "classifier": None})
    unregister("toy")
    register(register_without)
    model = create("toy", "one")
    with pytest.raises(ExportError, match="no official model.*--format pth"):
        save_backbone(model.state_dict(), model, tmp_path / "toy.pth", "official")
    with pytest.raises(ExportError, match="no timm models.*--format pth"):
        save_backbone(model.state_dict(), model, tmp_path / "toy_timm", "timm")
    assert not list(tmp_path.iterdir())


def test_a_third_family_with_a_classifier_becomes_a_timm_model(tmp_path):
    import timm

    module = load_toy()  # with timm imported: its models are registered at once
    try:
        assert "toy_one" in timm.list_models(module="timm_models")
        official = module.ToyNet("one", head=True)
        path = tmp_path / "toy_release.pth"
        torch.save({"model": official.state_dict()}, path)
        overlay = dict(file=str(path))
        model = timm.create_model("toy_one", pretrained=True, pretrained_cfg_overlay=overlay, num_classes=10).eval()
        x = torch.randn(2, 3, 64, 96)
        with torch.no_grad():
            pooled = official.eval()(x)[-1].mean((2, 3))
            torch.testing.assert_close(model(x), official.head(pooled), rtol=0, atol=0)
            features = timm.create_model("toy_one", features_only=True, out_indices=(1, 3))
            assert [f.shape[1] for f in features(x)] == [16, 64]
    finally:
        unregister("toy")


def test_loading_errors_name_every_registered_family(toy):
    named = ", ".join(f.title for f in FAMILIES.values() if f is not toy.FAMILY) + " or Toy"
    with pytest.raises(TypeError, match=re.escape(f"a backbone of a registered family ({named}), got Linear")):
        load_pretrained(nn.Linear(2, 2), {})
    model = create("toy", "one")
    with pytest.raises(CheckpointError, match=re.escape(f"none of its keys belong to {named}, and none")):
        load_pretrained(model, {"fc.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError, match=re.escape(f"is not a {named} checkpoint")):
        load_pretrained(model, {"backbone.fc.weight": torch.zeros(1)})


def test_the_measuring_tools_give_rows_to_a_family_with_only_its_record(toy, tmp_path, capsys):
    # no official code, no named settings, no paper figures: rows for what it has, nothing invented
    unregister("toy")
    register(Family(**{**toy.FAMILY.__dict__, "official": None}))
    threads = torch.get_num_threads()
    try:
        rows = tmp_path / "rows.json"
        argv = ["--family", "toy", "--arch", "shrunk", "--size", "64x64", "--no-memory", "--repeat", "1"]
        load_tool("benchmark").main([*argv, "--warmup", "0", "--threads", "1", "--json", str(rows)])
        (row,) = json.loads(rows.read_text())
        assert (row["model"], row["family"], row["arch"]) == ("ours", "toy", "shrunk") and row["seconds"] > 0
        assert load_tool("benchmark").parse_args(["--family", "toy"]).arch is None  # the record's variant: 'one'

        gpu_report, out = load_tool("gpu_report"), tmp_path / "report.md"
        # every family's rows (none measured: the budget is spent at once), the toy's among them
        assert gpu_report.main(["--device", "cpu", "--quick", "--budget-s", "0", "--sections", "exactness"]) == 0
        assert ["Toy one (shrunk)"] * 3 == [
            r[0] for r in report_tables(capsys.readouterr().out)[EXACT] if "Toy" in r[0]
        ]
        # the toy's rows measured (the training rows run the same code per model, at 6 s with Swin-T's: left out)
        sections = "exactness,throughput"
        argv = ["--device", "cpu", "--quick", "--families", "toy", "--sections", sections, "--out", str(out)]
        assert gpu_report.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    report = out.read_text()
    assert report.startswith("# GPU report: Toy backbones") and "## Errors" not in report, report
    tables = {title.split(" (")[0]: rows for title, rows in report_tables(report).items()}
    assert [(r[0], r[4]) for r in tables["Exactness"]] == [("Toy one (shrunk)", "n/a: no official file given")] * 3
    assert all(float(r[3]) < 1e-4 and r[5] == "ok" for r in tables["Exactness"])
    assert [(r[0], r[3]) for r in tables["Throughput"]] == [("toy-shrunk", "n/a"), ("Swin-T (shrunk)", "n/a")]
    assert all(float(r[1]) > 0 for r in tables["Throughput"])
