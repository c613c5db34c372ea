"""Parameter and FLOP audit of any ``nn.Module``: where the weights and the work are.

The report that motivates stoker had a network whose single ``Linear(301056, 1)``
head held 61% of its parameters. :func:`audit_model` finds such a layer in any
model, without the CLI::

    from stoker.model.audit import audit_model
    a = audit_model(net, input_size=(3, 224, 224))
    print(a.format_table())
    if a.dominant:
        print(a.dominant.name, f"{a.dominant.param_share:.0%}")

Parameters are attributed to the module that owns them (shared weights counted
once), so the per-layer counts add up to the total. FLOPs come from
``torch.utils.flop_counter.FlopCounterMode`` over one forward pass of a single
image, run on the ``meta`` device when the model allows it (no compute, no copy of
the weights), else for real under ``no_grad``. FLOPs are counted as PyTorch does:
2 per multiply-add; a training step costs about 3x the forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from stoker.errors import ArgumentError

# A head this wide in front of a Linear is almost always ``flatten`` of a feature map.
_FLATTEN_HEAD_MIN_IN = 4096


@dataclass
class LayerAudit:
    """One module that owns parameters (or does work) in the audited model.

    Attributes:
        name: dotted path in ``model.named_modules()`` (``""`` for the root).
        kind: class name, e.g. ``"Linear"``.
        detail: the module's ``extra_repr()``, e.g. ``"in_features=301056, out_features=1, bias=True"``.
        params: parameters owned directly by this module (not its children).
        param_share: ``params / total_params``.
        flops: forward FLOPs per image of this module (children included), or None when
            they could not be counted.
        flop_share: ``flops / flops_per_image`` or None.
        out_shape: output shape per image (``[C, H, W]`` for a conv), when recorded.
    """

    name: str
    kind: str
    detail: str
    params: int
    param_share: float
    flops: int | None = None
    flop_share: float | None = None
    out_shape: list | None = None


@dataclass
class ModelAudit:
    """The result of :func:`audit_model`; ``to_dict()`` is JSON-ready.

    Attributes:
        model: class name of the audited model.
        total_params: every parameter, shared ones once.
        trainable_params: those with ``requires_grad``.
        input_size: ``(C, H, W)`` of the one image the FLOPs were counted on.
        flops_per_image: forward FLOPs per image (2 per multiply-add), or None.
        flop_method: ``"meta"``, ``"real"`` or None (counting failed; see ``flop_error``).
        layers: modules owning parameters, largest first.
        dominant: the layer holding at least ``dominant_share`` of the parameters, if any.
        dominant_share: the threshold used.
        flatten_head: True when ``dominant`` is a Linear fed by a flattened feature map
            (replace with ``AdaptiveAvgPool2d(1)`` + a small Linear).
        full_res_flop_share: share of the forward FLOPs done by layers whose output keeps the
            input's full height and width (no downsampling before them), or None.
        flop_error: why FLOPs are missing, if they are.
    """

    model: str
    total_params: int
    trainable_params: int
    input_size: tuple
    flops_per_image: int | None
    flop_method: str | None
    layers: list = field(default_factory=list)
    dominant: LayerAudit | None = None
    dominant_share: float = 0.5
    flatten_head: bool = False
    full_res_flop_share: float | None = None
    flop_error: str | None = None

    def largest(self, n: int = 5) -> list:
        """The ``n`` layers with the most parameters."""
        return self.layers[:n]

    def heaviest(self, n: int = 5) -> list:
        """The ``n`` layers with the most forward FLOPs (empty when FLOPs are unknown)."""
        counted = [la for la in self.layers if la.flops is not None]
        return sorted(counted, key=lambda la: (-la.flops, la.name))[:n]

    def to_dict(self, top: int | None = None) -> dict:
        """JSON-ready dict; ``top`` keeps only the largest layers."""
        d = asdict(self)
        d["input_size"] = list(self.input_size)
        if top is not None:
            d["layers"] = d["layers"][:top]
        return d

    def format_table(self, top: int = 5) -> str:
        """A human table of the largest layers, with the dominant one marked."""
        lines = [f"{'layer':<32} {'kind':<18} {'params':>12} {'share':>6} {'GFLOPs':>8}"]
        for la in self.largest(top):
            mark = "  <-- holds most parameters" if self.dominant is la else ""
            gf = f"{la.flops / 1e9:8.3f}" if la.flops is not None else f"{'?':>8}"
            name = la.name or "(root)"
            lines.append(f"{name[:32]:<32} {la.kind[:18]:<18} {la.params:>12,} {la.param_share:>6.1%} {gf}{mark}")
        gf_total = f"{self.flops_per_image / 1e9:.3f}" if self.flops_per_image is not None else "?"
        lines.append(
            f"total: {self.total_params:,} parameters, {gf_total} GFLOPs forward per "
            f"{'x'.join(map(str, self.input_size))} image"
        )
        return "\n".join(lines)


def _owner(param_name: str) -> str:
    return param_name.rpartition(".")[0]


def _count_flops(model: nn.Module, input_size: Sequence[int], input_dtype: torch.dtype):
    """FLOPs per module path for one image; tries ``meta`` first, then a real forward."""
    from torch.utils.flop_counter import FlopCounterMode

    root = type(model).__name__
    errors = []
    shapes: dict = {}

    def hook(path):
        def record(module, args, out):
            if isinstance(out, torch.Tensor):
                shapes[path] = list(out.shape[1:])

        return record

    handles = [m.register_forward_hook(hook(path)) for path, m in model.named_modules()]
    was_training = model.training
    model.eval()  # BatchNorm refuses a batch of 1 in train mode; FLOPs are the same
    try:
        for method in ("meta", "real"):
            shapes.clear()
            try:
                counter = FlopCounterMode(display=False, depth=None)
                if method == "meta":
                    # Swap every tensor for a meta twin: nothing computed, no weights copied.
                    state = {
                        k: torch.empty_like(v, device="meta")
                        for k, v in list(model.named_parameters()) + list(model.named_buffers())
                    }
                    x = _example(input_size, input_dtype, "meta")
                    with counter, torch.no_grad():
                        torch.func.functional_call(model, state, (x,))
                else:
                    p = next(model.parameters(), None)
                    device = p.device if p is not None else torch.device("cpu")
                    x = _example(input_size, input_dtype, device)
                    with counter, torch.no_grad():
                        model(x)
                counts = counter.get_flop_counts()
                per_module = {}
                for key, ops in counts.items():
                    if key == "Global":
                        continue
                    if key == root:
                        path = ""
                    elif key.startswith(root + "."):
                        path = key[len(root) + 1 :]
                    else:
                        continue
                    per_module[path] = int(sum(ops.values()))
                return int(counter.get_total_flops()), per_module, dict(shapes), method, None
            except Exception as e:  # boundary: the user's model; reported in the returned reason, the next way is tried
                errors.append(f"{method}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return None, {}, {}, None, "; ".join(errors)


def _example(input_size: Sequence[int], dtype: torch.dtype, device) -> torch.Tensor:
    shape = (1, *input_size)
    if str(device) == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device)


def audit_model(
    model: nn.Module,
    *,
    input_size: Sequence[int] = (3, 224, 224),
    input_dtype: torch.dtype = torch.float32,
    dominant_share: float = 0.5,
    count_flops: bool = True,
) -> ModelAudit:
    """Audit ``model``'s parameters per layer and its FLOPs per image.

    Args:
        model: any ``nn.Module`` taking one ``[N, *input_size]`` tensor.
        input_size: ``(C, H, W)`` of one input image for the FLOP count.
        input_dtype: dtype of that input (``torch.uint8`` for a model wrapped with
            :func:`stoker.model.with_normalize`).
        dominant_share: a layer holding at least this share of all parameters is
            reported as ``dominant``.
        count_flops: False skips the forward pass (parameters only).

    Returns:
        A :class:`ModelAudit`; its ``layers`` are sorted by parameter count, largest first.

    Raises:
        ValueError: ``model`` is not an ``nn.Module``, or ``input_size`` /
            ``dominant_share`` is out of range.
    """
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    input_size = tuple(int(s) for s in input_size)
    if not input_size or any(s <= 0 for s in input_size):
        raise ArgumentError(f"input_size must be positive sizes like (3, 224, 224), got {input_size}")
    if not 0.0 < dominant_share <= 1.0:
        raise ArgumentError(f"dominant_share must be in (0, 1], got {dominant_share}")

    owned: dict = {}
    total = trainable = 0
    for name, p in model.named_parameters():  # shared tensors are yielded once
        owned[_owner(name)] = owned.get(_owner(name), 0) + p.numel()
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0

    flops_total, per_module, shapes, method, err = (None, {}, {}, None, "skipped")
    if count_flops:
        flops_total, per_module, shapes, method, err = _count_flops(model, input_size, input_dtype)

    modules = dict(model.named_modules())
    # Work done at the input's full spatial size (leaf layers whose output keeps H x W).
    full_res = None
    if flops_total and len(input_size) == 3:
        leaves = [p for p, m in modules.items() if not any(True for _ in m.children())]
        done = sum(
            per_module.get(p, 0)
            for p in leaves
            if len(shapes.get(p, ())) == 3 and tuple(shapes[p][-2:]) == input_size[-2:]
        )
        full_res = done / flops_total
    layers = []
    for path, n in owned.items():
        mod = modules[path]
        f = per_module.get(path, 0 if flops_total is not None else None)
        layers.append(
            LayerAudit(
                name=path,
                kind=type(mod).__name__,
                detail=mod.extra_repr(),
                params=n,
                param_share=n / total if total else 0.0,
                flops=f,
                flop_share=(f / flops_total) if (f is not None and flops_total) else None,
                out_shape=shapes.get(path),
            )
        )
    layers.sort(key=lambda la: (-la.params, la.name))

    dominant = layers[0] if layers and layers[0].param_share >= dominant_share else None
    flatten_head = bool(
        dominant is not None
        and isinstance(modules[dominant.name], nn.Linear)
        and modules[dominant.name].in_features >= _FLATTEN_HEAD_MIN_IN
    )
    return ModelAudit(
        model=type(model).__name__,
        total_params=total,
        trainable_params=trainable,
        input_size=input_size,
        flops_per_image=flops_total,
        flop_method=method,
        layers=layers,
        dominant=dominant,
        dominant_share=dominant_share,
        flatten_head=flatten_head,
        full_res_flop_share=full_res,
        flop_error=err,
    )
