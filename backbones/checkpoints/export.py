"""A backbone's export formats: ``pth``, ``safetensors`` and the official classification layout, each with a
meta (family, arch, provenance, sha256 of the tensors). Pure PyTorch: reading training checkpoints and configs
to find the tensors is ``tasks/deploy/export.py``'s job (``tools/export_backbone.py`` is the command line).

Every file is written to a temp file in the target's directory, fsynced and ``os.replace``-d, and the same
input always gives the same bytes (sorted keys, no timestamps, each tensor in its own storage).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
from collections.abc import Mapping

import torch

from ..errors import CheckpointError, UserError
from ..families import family_of, get
from ..ops.switch import fast_paths
from .atomic import atomic_write, plain_meta
from .pretrained import SAFETENSORS_META_KEY, arch_signature, load_pretrained
from .weights import read_checkpoint, state_dict_diff

FORMATS = ("pth", "safetensors", "official", "onnx", "timm")
EXTENSIONS = {"pth": (".pth", ".pt"), "official": (".pth", ".pt"), "safetensors": (".safetensors",), "onnx": (".onnx",)}
TIMM_FILES = ("config.json", "model.safetensors")  # what timm.models.save_for_hf writes
EXPORT_VERSION = 1
# official keys with no counterpart in our backbones (the classification head): left out, for the user to fill


class ExportError(UserError, ValueError):
    """A usage problem (format vs. extension, no config, no official counterpart); the message names it."""


# --- formats and extensions ------------------------------------------------------------------------------
def resolve_format(out: str | os.PathLike, fmt: str | None = None) -> str:
    """The export format for ``out``: ``fmt`` if it fits the extension, else inferred from the extension."""
    out = os.fspath(out)
    ext = os.path.splitext(out)[1].lower()
    if fmt is None:
        if ext in EXTENSIONS["safetensors"]:
            return "safetensors"
        if ext in EXTENSIONS["pth"]:
            return "pth"
        if ext in EXTENSIONS["onnx"]:
            return "onnx"
        raise ExportError(
            f"Cannot infer the export format from {out!r}: use a .pth / .pt file (formats 'pth' "
            "and 'official'), a .safetensors file (format 'safetensors') or a .onnx file (format "
            "'onnx')."
        )
    if fmt not in FORMATS:
        raise ExportError(f"Unknown format {fmt!r}; choose one of {list(FORMATS)}.")
    if fmt == "timm":  # a folder, any name
        if os.path.isfile(out):
            raise ExportError(f"A timm export is a folder ({', '.join(TIMM_FILES)}); {out!r} is a file.")
        return fmt
    if ext not in EXTENSIONS[fmt]:
        raise ExportError(
            f"Format {fmt!r} does not match the extension of {out!r}: a {fmt} export must be "
            f"named {' or '.join(EXTENSIONS[fmt])}."
        )
    return fmt


# --- tensors ---------------------------------------------------------------------------------------------
def canonical_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sorted keys, CPU, contiguous, one storage per tensor: serialises to the same bytes every time."""
    return {k: sd[k].detach().to("cpu", copy=True).contiguous() for k in sorted(sd)}


def tensor_sha256(sd: Mapping[str, torch.Tensor]) -> str:
    """sha256 over sorted keys, each with its dtype, shape and raw bytes (independent of the file format)."""
    h = hashlib.sha256()
    for k in sorted(sd):
        t = sd[k].detach().to("cpu").contiguous()
        h.update(f"{k}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def official_state_dict(sd: Mapping[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """Ours -> the official classification model's key layout, head keys absent.

    Our parameter names already are the official ones; the family's ``official_extras`` adds what the official
    layout holds beyond them (STViT: the constant identity kernels of its conv-based Unfold / Fold).
    """
    if get(family).official is None:
        raise ExportError(
            f"The {family} family has no official model (its registry record gives no official code), so there "
            "is no official layout to export to. Export with --format pth or safetensors instead."
        )
    extra = sorted(k for k in sd if k.startswith("out_norms."))
    if extra:
        raise ExportError(
            f"The backbone has output norms (norm_out=True: {extra[:2]}...) that the official "
            f"{family} model does not have, so an 'official' export would lose them. Export with "
            "--format pth or safetensors instead."
        )
    out = dict(sd)
    extras = get(family).official_extras
    if extras is not None:
        try:
            out.update(extras(sd))
        except ValueError as e:
            raise ExportError(str(e)) from e
    return canonical_state_dict(out)


# --- atomic, reproducible writes -------------------------------------------------------------------------
def save_torch(obj: dict, path: str | os.PathLike) -> None:
    # Through a file object: torch.save then names the archive 'archive', not after the (random) temp file.
    atomic_write(path, lambda f: torch.save(obj, f))


def save_safetensors(sd: Mapping[str, torch.Tensor], meta: dict, path: str | os.PathLike) -> None:
    from safetensors.torch import save

    # One metadata entry only: the header's metadata map has no defined order across processes.
    data = save(dict(sd), metadata={SAFETENSORS_META_KEY: json.dumps(meta, sort_keys=True)})
    atomic_write(path, lambda f: f.write(data))


# --- a backbone's export ----------------------------------------------------------------------------
def save_backbone(
    sd: Mapping[str, torch.Tensor],
    model: torch.nn.Module,
    out: str | os.PathLike,
    fmt: str | None = None,
    provenance: Mapping | None = None,
) -> dict:
    """Write a backbone's tensors to ``out`` in ``fmt`` with their meta; returns the meta that was recorded.

    Args:
        sd: the tensors to write, backbone-relative keys; ``model.state_dict()`` for a backbone in memory. Keys
            and shapes must be those of ``model.state_dict()`` (an ``ExportError`` names the differences).
        model: the STViT / HATNet they belong to: family, arch, out_indices and norm_out go into the meta.
        out: the file to write (atomically).
        fmt: 'pth', 'safetensors', 'official' or 'onnx' (``export_onnx``, the meta as the graph's metadata
            "meta"); None: from the extension of ``out``.
        provenance: more meta entries (where the tensors come from: checkpoint, config, step, metrics...).

    The meta holds JSON types only, the same in every format.
    """
    out = os.fspath(out)
    fmt = resolve_format(out, fmt)
    # the meta records the model's family and arch: tensors of another model would make an export that no
    # model of that arch loads
    if fmt == "timm" and getattr(model, "norm_out", False):
        raise ExportError(
            "The backbone has output norms (norm_out=True), which the timm models do not have. Export with "
            "--format pth or safetensors instead."
        )
    diff = state_dict_diff(sd, model.state_dict())
    if diff:
        raise ExportError(
            f"The tensors to export do not fit the {type(model).__name__} they are exported as "
            f"({model.family}, arch {model.arch}): {diff} Pass that model's own state_dict(), or the model the "
            "tensors belong to."
        )
    sd = official_state_dict(sd, model.family) if fmt == "official" else canonical_state_dict(sd)
    meta = plain_meta(
        {
            **(provenance or {}),
            "export_version": EXPORT_VERSION,
            "format": fmt,
            "family": model.family,
            "arch": model.arch,
            "out_indices": list(model.out_indices),
            "norm_out": bool(getattr(model, "norm_out", False)),
            "num_tensors": len(sd),
            "num_params": int(sum(t.numel() for t in sd.values())),
            "sha256": tensor_sha256(sd),
        }
    )
    if fmt == "timm":
        timm_model = timm_classifier(model, with_head=False)
        timm_model.backbone.load_state_dict(sd, strict=True)
        save_timm(timm_model, out, meta)
    elif fmt == "onnx":
        with_weights = copy.deepcopy(model)
        with_weights.load_state_dict(sd, strict=True)
        export_onnx(with_weights, out, meta=meta)
    elif fmt == "safetensors":
        save_safetensors(sd, meta, out)
    elif fmt == "official":
        save_torch({"model": sd, "meta": meta}, out)  # the released checkpoints' {'model': ...} layout
    else:
        save_torch({"state_dict": sd, "meta": meta}, out)
    return meta


def read_export(path: str | os.PathLike) -> tuple[dict, dict]:
    """(tensors, meta) of an export in any of the three formats."""
    obj, st_meta = read_checkpoint(path)
    if SAFETENSORS_META_KEY in st_meta:
        return dict(obj), json.loads(st_meta[SAFETENSORS_META_KEY])
    for key in ("state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            return dict(obj[key]), dict(obj.get("meta") or {})
    raise CheckpointError(f"{os.fspath(path)!r} is not a backbone export (no 'state_dict' / 'model' entry).")


def verify_export(path: str | os.PathLike) -> dict:
    """Recompute the tensors' sha256 and compare with the recorded one; returns the meta.

    An ONNX export holds the graph's form of the tensors (constants folded), not the tensors that were hashed:
    its graph is checked with ``onnx.checker`` instead (a truncated or damaged file fails), and its meta (the
    graph's metadata "meta") is returned."""
    if os.fspath(path).lower().endswith(".onnx"):
        return _verify_onnx(os.fspath(path))
    sd, meta = read_export(path)
    if meta.get("sha256") != tensor_sha256(sd):
        raise CheckpointError(
            f"{os.fspath(path)!r}: the tensors' sha256 does not match the one recorded in its "
            "meta; the file was modified or damaged."
        )
    return meta


def _verify_onnx(path: str) -> dict:
    import onnx

    if not os.path.isfile(path):
        raise CheckpointError(f"ONNX export not found: {path!r}.")
    try:
        graph = onnx.load(path)
        onnx.checker.check_model(graph)
    except Exception as e:  # DecodeError, ValidationError...: whatever broken bytes raise
        raise CheckpointError(f"{path!r} is not a valid ONNX graph: the file is truncated or damaged ({e}).") from e
    props = {p.key: p.value for p in graph.metadata_props}
    if "meta" not in props:
        raise CheckpointError(f"{path!r} is an ONNX graph without our export's metadata ('meta'): not an export.")
    return json.loads(props["meta"])


# --- timm ------------------------------------------------------------------------------------------------
def timm_classifier(backbone: torch.nn.Module, with_head: bool, **kwargs) -> torch.nn.Module:
    """The timm model (``backbones.timm_models``) of a backbone's family and arch, without weights: named after
    the released variant of that arch, else after the family's first (its ``arch`` says the rest)."""
    import timm

    family = get(backbone.family)
    if family.classifier is None:
        raise ExportError(
            f"The {family.name} family has no timm models (its record gives no classifier), so there is no timm "
            "model to export to. Export with --format pth, safetensors or onnx instead."
        )
    with torch.device("meta"):
        variant = next((v for v in family.released if family.cls(v).arch == backbone.arch), None)
    name = f"{family.name}_{variant or family.released[0]}"
    num_classes = kwargs.pop("num_classes", 1000 if with_head else 0)
    return timm.create_model(name, arch=backbone.arch, with_head=with_head, num_classes=num_classes, **kwargs)


def save_timm(model: torch.nn.Module, out: str | os.PathLike, meta: Mapping) -> None:
    """Write a timm model into the folder ``out`` as timm's hub tools do (``timm.models.save_for_hf``):
    ``config.json`` (architecture, model_args, pretrained_cfg; ``meta`` under "meta") and ``model.safetensors``.
    The folder is written whole next to ``out``, then renamed onto it; an ``out`` that holds anything but an
    earlier timm export is refused."""
    import shutil
    import tempfile

    from timm.models import save_for_hf

    out = os.path.abspath(os.fspath(out))
    if os.path.isdir(out) and set(os.listdir(out)) - set(TIMM_FILES):
        raise ExportError(
            f"{out!r} holds other files than a timm export's ({', '.join(TIMM_FILES)}): give a new or empty folder."
        )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=os.path.dirname(out))
    try:
        save_for_hf(model, tmp, model_config={"meta": plain_meta(dict(meta))}, safe_serialization=True)
        for name in TIMM_FILES:
            with open(os.path.join(tmp, name), "rb") as f:
                os.fsync(f.fileno())
        if os.path.isdir(out):  # an earlier export: moved aside, then removed once the new one is in place
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".old", dir=os.path.dirname(out))
            os.replace(out, os.path.join(old, "export"))
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_release(path: str | os.PathLike, out: str | os.PathLike, fmt: str | None = None) -> dict:
    """Export an official release (``{'model': ...}``, as downloaded) of a released variant; the ``timm`` format
    keeps its classification head. Returns the meta that was recorded."""
    fmt = resolve_format(out, fmt)
    obj, _ = read_checkpoint(path)
    sd = obj["model"]
    family = family_of(sd)
    if family is None:
        raise CheckpointError(f"{os.fspath(path)!r} holds no backbone of a registered family.")
    signature = arch_signature(sd, family.name)
    with torch.device("meta"):  # the variants' keys and shapes, no memory
        variants = {v: arch_signature(family.cls(v).state_dict(), family.name) for v in family.released}
    variant = next((v for v, sig in variants.items() if sig == signature), None)
    if variant is None:
        raise CheckpointError(
            f"{os.fspath(path)!r} is a {family.title} of channels and depths {signature}, which no released "
            f"variant ({', '.join(family.released)}) has: export the checkpoint of a training run instead."
        )
    backbone = family.cls(variant)
    load_pretrained(backbone, obj)
    provenance = {
        "source": {"checkpoint": os.fspath(path), "kind": "official release"},
        "variant": variant,
        "weights": "raw",  # the release's 'model' entry, as the official evaluation loads it (not 'model_ema')
        "step": None,
        "epoch": obj.get("epoch") if isinstance(obj.get("epoch"), int) else None,
        "metrics": {},
    }
    if fmt != "timm":
        return save_backbone(backbone.state_dict(), backbone, out, fmt, provenance)
    model = timm_classifier(backbone, with_head=True, num_classes=_release_classes(sd, family))
    model.load_pretrained(path)
    sd = model.state_dict()
    meta = {**provenance, "export_version": EXPORT_VERSION, "format": fmt, "family": family.name}
    meta.update(arch=backbone.arch, num_tensors=len(sd), num_params=sum(t.numel() for t in sd.values()))
    meta = plain_meta({**meta, "sha256": tensor_sha256(sd)})
    save_timm(model, out, meta)
    return meta


def _release_classes(sd: Mapping[str, torch.Tensor], family) -> int:
    """The classes of a release's classifier (the official key that becomes the timm model's ``head.fc.weight``):
    a timm model of another number of classes would leave the release's classifier out and keep a random one.
    1000 (ImageNet-1k) where the release has none: the timm model then refuses the file, naming the keys."""
    if family.classifier is None:
        return 1000  # timm_classifier refuses the family
    prefix = next((old for old, new in family.classifier.official_keys.items() if new == "head.fc."), None)
    weight = sd.get(f"{prefix}weight") if prefix is not None else None
    return weight.shape[0] if isinstance(weight, torch.Tensor) and weight.ndim == 2 else 1000


# --- ONNX ------------------------------------------------------------------------------------------------
def export_onnx(
    model: torch.nn.Module,
    path: str | os.PathLike,
    opset: int | None = None,
    *,
    meta: Mapping | None = None,
    example_size: tuple[int, int] = (96, 128),
) -> list[str]:
    """Write a backbone as an ONNX graph; returns its output names.

    The graph is the plain formulation (traced inside ``fast_paths(False)``, eval mode) with one input
    ``image`` (batch, 3, height, width) and one output per selected stage, ``stage{i}`` for i in
    ``model.out_indices`` (stride 4 * 2**i, the feature maps ``model(image)`` returns). Batch, height and
    width are dynamic: STViT's padding to whole super tokens and HAT-Net's partial border windows are part of
    the graph, so any size of at least 32x32 runs. Written atomically.

    Args:
        model: an STViT or HATNet with its weights; left in the train/eval mode it was in.
        path: the .onnx file to write.
        opset: the ONNX opset; None: torch's default.
        meta: written as JSON into the graph's metadata under "meta" (e.g. ``save_backbone``'s meta).
        example_size: the (height, width) of the example input that is traced; any size gives the same graph.
    """
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - onnx is a pinned requirement
        raise ExportError("ONNX export needs the onnx package: pip install onnx (see setup.cfg).") from e
    import warnings

    names = [f"stage{i}" for i in model.out_indices]
    dynamic = {"image": {0: "batch", 2: "height", 3: "width"}}
    dynamic.update({n: {0: "batch", 2: f"{n}_height", 3: f"{n}_width"} for n in names})
    # batch 2: a traced batch of 1 could be taken for a constant
    example = torch.randn(2, 3, *example_size, device=next(model.parameters()).device)
    buffer, was_training = io.BytesIO(), model.training
    try:
        model.eval()
        with fast_paths(False), torch.no_grad(), warnings.catch_warnings():
            # The tracer warns at every shape it reads as a Python value (the padding and window arithmetic); the
            # sizes are dynamic axes, and the tests run the graph at sizes other than the traced one.
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            # torch >= 2.9 notes that the TorchScript exporter (dynamo=False) is legacy; the dynamo exporter needs
            # onnxscript, which is not among the pinned requirements.
            warnings.filterwarnings(
                "ignore", "You are using the legacy TorchScript-based ONNX export", DeprecationWarning
            )
            warnings.filterwarnings("ignore", "The feature will be removed", DeprecationWarning, r"torch\.onnx\.")
            torch.onnx.export(
                model,
                (example,),
                buffer,
                dynamo=False,
                opset_version=opset,
                input_names=["image"],
                output_names=names,
                dynamic_axes=dynamic,
            )
    finally:
        model.train(was_training)
    graph = onnx.load_from_string(buffer.getvalue())
    if meta is not None:
        onnx.helper.set_model_props(graph, {"meta": json.dumps(plain_meta(dict(meta)), sort_keys=True)})
    atomic_write(path, lambda f: f.write(graph.SerializeToString()))
    return names
