"""backbones/checkpoints/weights.py and backbones/checkpoints/download.py: checkpoint URLs (downloaded once into
torch.hub's cache, verified by sha256) from an HTTP server on 127.0.0.1, the key / shape report, and the config's
``load_from`` in tools/train.py (fine-tuning from an exported model of the session's demo run, a checkpoint with another
class count, ``--resume`` winning)."""

import hashlib
import http.server
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from backbones import STViT, load_model_weights, load_pretrained
from backbones.checkpoints.download import cache_path, fetch
from backbones.errors import CheckpointError
from tasks.config.load import load_config
from tests._tools import DET_CFG, load_tool

# --- URLs --------------------------------------------------------------------------------------------------


class _Server:
    """http.server on 127.0.0.1 serving ``root`` in a thread; ``requests`` lists the paths asked for."""

    def __init__(self, root: Path):
        self.root, self.requests = root, []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):  # no request lines on stderr
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local HTTP server over ``tmp_path/served`` and torch.hub's cache in ``tmp_path/torch_home``."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    (tmp_path / "served").mkdir()
    srv = _Server(tmp_path / "served")
    yield srv
    srv.close()


def _serve(server, name: str, obj) -> str:
    """Save ``obj`` as ``name`` on the server; returns the file's sha256."""
    path = server.root / name
    torch.save(obj, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _backbone(seed: int) -> STViT:
    torch.manual_seed(seed)
    return STViT("shrunk")


def test_url_downloads_once_into_torch_hub_cache_and_loads(server, tmp_path):
    src = _backbone(0)
    digest = _serve(server, "stvit.pth", {"state_dict": src.state_dict()})
    url = f"{server.url}/stvit.pth#sha256={digest}"
    model = _backbone(1)
    load_pretrained(model, url)
    cached = tmp_path / "torch_home" / "hub" / "checkpoints" / "stvit.pth"
    assert cache_path(url) == str(cached) and cached.is_file()
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == digest
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert fetch(url) == str(cached)  # a cache hit: verified again, not downloaded again
    assert server.requests == ["/stvit.pth"]
    assert not [p for p in cached.parent.iterdir() if p.name != "stvit.pth"]  # no temp file left behind


def test_cached_file_that_fails_its_hash_is_downloaded_again(server, tmp_path):
    digest = _serve(server, "m.pth", {"w": torch.ones(2)})
    url = f"{server.url}/m.pth#sha256={digest}"
    path = Path(fetch(url))
    path.write_bytes(b"corrupt")
    assert fetch(url) == str(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert len(server.requests) == 2


def test_hash_prefix_in_the_file_name_is_checked(server):
    digest = _serve(server, "good.pth", {"w": torch.ones(3)})
    os.replace(server.root / "good.pth", server.root / f"model-{digest[:8]}.pth")
    assert load_model_weights(_Lin(3), f"{server.url}/model-{digest[:8]}.pth").loaded == ["w"]
    os.replace(server.root / f"model-{digest[:8]}.pth", server.root / "model-deadbeef.pth")
    with pytest.raises(CheckpointError, match=rf"sha256 is {digest}, but the hash prefix in the file name.*deadbeef"):
        fetch(f"{server.url}/model-deadbeef.pth")
    assert not os.path.exists(cache_path(f"{server.url}/model-deadbeef.pth"))


def test_wrong_hash_deletes_the_file_and_names_both_hashes(server):
    digest = _serve(server, "m.pth", {"w": torch.ones(2)})
    wrong = "0" * 64
    url = f"{server.url}/m.pth#sha256={wrong}"
    with pytest.raises(CheckpointError) as info:
        load_model_weights(_Lin(2), url)
    assert digest in str(info.value) and wrong in str(info.value) and "deleted" in str(info.value)
    assert not os.path.exists(cache_path(url))
    assert not os.listdir(os.path.dirname(cache_path(url)))  # nor a temp file
    with pytest.raises(CheckpointError, match=r"fragment #sha256=abc is not 'sha256=<64 hex digits>'"):
        fetch(f"{server.url}/m.pth#sha256=abc")


def test_init_cfg_pretrained_url_with_sha256_key(server):
    from mmdet.registry import MODELS

    src = _backbone(0)
    digest = _serve(server, "bb.pth", {"state_dict": src.state_dict()})
    cfg = dict(type="STViT", arch="shrunk", init_cfg=dict(type="Pretrained", checkpoint=f"{server.url}/bb.pth"))
    model = MODELS.build({**cfg, "init_cfg": {**cfg["init_cfg"], "sha256": digest}})
    model.init_weights()
    torch.testing.assert_close(model.state_dict(), src.state_dict(), rtol=0, atol=0)
    bad = MODELS.build({**cfg, "init_cfg": {**cfg["init_cfg"], "sha256": "f" * 64}})
    with pytest.raises(CheckpointError, match=f"sha256 is {digest}, but the given sha256 says {'f' * 64}"):
        bad.init_weights()


def test_server_down_names_the_url_and_the_cache_path(tmp_path, monkeypatch):
    from backbones.checkpoints import download

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(download, "BACKOFF_S", 0.01)  # a refused connection is tried again too
    with socket.socket() as s:  # a port on 127.0.0.1 that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/stvit.pth"
    with pytest.raises(CheckpointError) as info:
        load_pretrained(_backbone(0), url)
    msg = str(info.value)
    assert f"Cannot download checkpoint '{url}'" in msg
    assert str(tmp_path / "torch_home" / "hub" / "checkpoints" / "stvit.pth") in msg and "by hand" in msg


# --- the key / shape report ------------------------------------------------------------------------------
class _Lin(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))


def test_report_skips_shape_mismatches_and_refuses_a_file_that_matches_nothing(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    other = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 5))  # another "class count"
    path = tmp_path / "other.pth"
    torch.save({"meta": {}, "state_dict": {"module." + k: v for k, v in other.state_dict().items()}}, path)
    report = load_model_weights(model, path)
    assert report.loaded == ["0.bias", "0.weight"] and report.missing == []
    assert report.mismatched == ["1.bias: checkpoint (5,) vs model (2,)", "1.weight: checkpoint (5, 3) vs model (2, 3)"]
    assert torch.equal(model[0].weight, other[0].weight) and not torch.equal(model[1].bias[:2], other[1].bias[:2])
    with pytest.raises(CheckpointError, match="does not match the Sequential. Shape mismatches"):
        load_model_weights(model, path, strict=True)
    torch.save({"state_dict": {"model.encoder.w": torch.ones(1)}}, path)  # Lightning layout, another model
    with pytest.raises(CheckpointError, match=rf"'{path}' does not fit this Sequential: none of its 1 tensors"):
        load_model_weights(model, path)


# --- load_from -------------------------------------------------------------------------------------------
def _det_opts(det_run, *extra):
    # the session run's options (tiny COCO at 96 px), one step, no validation
    return [
        *[o for o in det_run.opts if not o.startswith(("trainer.max_epochs", "trainer.limit_train_batches"))],
        "trainer.max_steps=1",
        "trainer.limit_val_batches=0",
        "checkpoint_callback.monitor=None",
        *extra,
    ]


class _FirstStepWeights:
    """A Lightning callback that keeps the model's tensors as the first training step starts."""

    def __new__(cls):
        import lightning as L

        class Callback(L.Callback):
            state = None

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if self.state is None:
                    self.state = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

        return Callback()


@pytest.mark.slow
def test_load_from_an_exported_model_starts_the_first_step_from_its_weights(det_run, tmp_path, capfd, caplog):
    exported = tmp_path / "model.pth"
    load_tool("export_model").main([det_run.ckpt, "--out", str(exported)])
    expected = torch.load(exported, weights_only=True)["state_dict"]
    seen = _FirstStepWeights()
    work = tmp_path / "finetune"
    opts = _det_opts(det_run, f"load_from={exported}")
    load_tool("train").main([DET_CFG, "--work-dir", str(work), "--cfg-options", *opts], callbacks=[seen])
    assert seen.state.keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(seen.state[k], v), k
    out = capfd.readouterr()
    assert f"load_from: Loaded {len(expected)} tensors from '{exported}'" in out.out + out.err + caplog.text


def test_load_from_another_class_count_skips_and_names_the_class_dependent_tensors(det_run, tmp_path, capfd, caplog):
    from mmengine.registry import MODELS

    from tasks import build_task
    from tasks.training.checkpoint_io import apply_load_from

    cfg = load_config(det_run.config)
    other = load_config(det_run.config)
    other.model.roi_head.bbox_head.num_classes = 5
    other.model.roi_head.mask_head.num_classes = 5
    with torch.no_grad():
        source = MODELS.build(other.model)
        source.init_weights()
    path = tmp_path / "five_classes.pth"
    torch.save(
        {"meta": {"epoch": 12, "dataset_meta": {"classes": list("abcde")}}, "state_dict": source.state_dict()}, path
    )
    module, _ = build_task(cfg)
    report = apply_load_from(module.model, str(path), resume=None)
    skipped = {m.split(":")[0] for m in report.mismatched}
    assert skipped == {
        "roi_head.bbox_head.fc_cls.weight",
        "roi_head.bbox_head.fc_cls.bias",
        "roi_head.bbox_head.fc_reg.weight",
        "roi_head.bbox_head.fc_reg.bias",
        "roi_head.mask_head.conv_logits.weight",
        "roi_head.mask_head.conv_logits.bias",
    }
    assert report.missing == [] and report.unexpected == []
    own = module.model.state_dict()
    assert set(report.loaded) == set(own) - skipped
    for k in report.loaded:
        assert torch.equal(own[k], source.state_dict()[k]), k
    out = capfd.readouterr()
    logged = out.out + out.err + caplog.text
    assert "skipped 6 for a shape mismatch: roi_head.bbox_head.fc_cls.bias: checkpoint (6,) vs model (4,)" in logged

    # --resume wins: the model is left as it is and the log says which checkpoint is used
    before = {k: v.clone() for k, v in own.items()}
    assert apply_load_from(module.model, "elsewhere.pth", resume=det_run.ckpt) is None
    assert all(torch.equal(v, module.model.state_dict()[k]) for k, v in before.items())
    out = capfd.readouterr()
    assert f"Resuming from {det_run.ckpt}; load_from='elsewhere.pth' is not used" in out.out + out.err + caplog.text


def test_load_from_a_backbone_export_is_refused_naming_the_file(det_run, tmp_path):
    from tasks import build_task
    from tasks.training.checkpoint_io import apply_load_from

    out = tmp_path / "backbone.pth"
    load_tool("export_backbone").main([det_run.ckpt, "--out", str(out)])
    module, _ = build_task(load_config(det_run.config), init_weights=False)
    with pytest.raises(CheckpointError, match=rf"'{out}' does not fit this MaskRCNN.*model.backbone.init_cfg"):
        apply_load_from(module.model, str(out), resume=None)


def test_tools_take_a_checkpoint_url(det_run, server, tmp_path):
    exported = tmp_path / "model.pth"
    load_tool("export_model").main([det_run.ckpt, "--out", str(exported)])
    shutil.copy(exported, server.root / "model.pth")
    digest = hashlib.sha256(exported.read_bytes()).hexdigest()
    url = f"{server.url}/model.pth#sha256={digest}"
    out = tmp_path / "bb.pth"
    meta = load_tool("export_backbone").main([url, "--out", str(out), "--config", det_run.config])
    assert meta["family"] == "stvit" and out.is_file()
    assert server.requests == ["/model.pth"]


def test_a_folder_given_as_a_checkpoint_is_named_with_the_files_in_it(tmp_path):
    # it was called "not found", which sends a user looking for a typo in a path that exists
    from backbones.checkpoints.weights import check_checkpoint_path

    (tmp_path / "last.ckpt").write_bytes(b"")
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(CheckpointError, match=rf"'{tmp_path}' is a folder, not a checkpoint file: .*\(last\.ckpt\)\.$"):
        check_checkpoint_path(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"is a folder, not a checkpoint file: give a file in it\.$"):
        check_checkpoint_path(tmp_path / "empty")
