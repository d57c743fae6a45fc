"""tools/print_config.py: the resolved config, with the overrides, as mmengine's pretty_text."""

from mmengine.config import Config

from tests._tools import DET_CFG, SEG_CFG, load_tool


def test_print_config_resolves_bases_and_overrides(capsys):
    text = load_tool("print_config").main(
        [DET_CFG, "--cfg-options", "trainer.max_epochs=3", "model.roi_head.bbox_head.num_classes=7"]
    )
    assert capsys.readouterr().out.strip() == text.strip()
    cfg = Config.fromstring(text, ".py")
    # the mmdet:: base is resolved (keys the demo config does not write itself) and the overrides applied
    assert cfg.model.type == "MaskRCNN" and cfg.model.rpn_head.type == "RPNHead"
    assert cfg.trainer.max_epochs == 3 and cfg.model.roi_head.bbox_head.num_classes == 7
    assert cfg.model.backbone.type == "STViT"


def test_print_config_segmentation():
    cfg = Config.fromstring(load_tool("print_config").main([SEG_CFG]), ".py")
    assert cfg.default_scope == "mmseg" and cfg.model.decode_head.type == "UPerHead"
