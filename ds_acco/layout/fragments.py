"""Which parameters form each Streaming DiLoCo fragment.

A fragment is a group of whole layers. The default split finds the model's stack of blocks (the longest
``nn.ModuleList`` of modules holding parameters: ``transformer.h`` in GPT-2, ``model.layers`` in Llama,
``encoder.layer`` in BERT), cuts it into ``P`` runs of consecutive blocks of (almost) equal length, and adds the
parameters registered before the stack (embeddings) to the first fragment and those registered after it (final norm,
untied head) to the last. A model without such a stack (e.g. an ``nn.Sequential``) uses its top-level children that hold
parameters as the layers.

Only trainable parameters (``requires_grad``) are placed; tied parameters count once, with the module that registers
them first.
"""

from __future__ import annotations

from typing import Iterable, Sequence, Union

from torch import nn

FIELD = "acco.streaming.fragments"


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def find_block_stack(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """``(qualified_name, module_list)`` of the longest ``nn.ModuleList`` whose entries all hold trainable
    parameters (ties: the one registered first), or None."""
    best = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and all(_trainable(m) for m in module):
            if best is None or len(module) > len(best[1]):
                best = (name, module)
    return best


def default_fragments(model: nn.Module, fragments: int) -> list[list[nn.Parameter]]:
    """The default split of ``model`` into ``fragments`` fragments (see the module docstring): its layers in
    order as units of trainable parameters, the parameters registered before the block stack in the first,
    those registered after it in the last, cut by :func:`split_units`."""
    stack = find_block_stack(model)
    if stack is None:
        blocks, where = list(model.children()), "top-level child modules with parameters"
    else:
        name, blocks = stack
        where = f"blocks in {name!r}"
    units = [u for u in map(_trainable, blocks) if u] or [[]]
    in_units = {id(p) for u in units for p in u}
    before, after, seen_units = [], [], False
    for p in model.parameters():  # registration order (the model's own first), tied parameters once
        if id(p) in in_units:
            seen_units = True
        elif p.requires_grad:
            (after if seen_units else before).append(p)
    units[0] = before + units[0]
    units[-1] = units[-1] + after
    units = _dedupe(units)
    if not units:
        raise ValueError("model: has no trainable parameters to split into fragments")
    return split_units(units, fragments, where)


def _dedupe(units: Iterable[list[nn.Parameter]]) -> list[list[nn.Parameter]]:
    seen: set[int] = set()
    out = []
    for unit in units:
        kept = []
        for p in unit:
            if id(p) not in seen:
                seen.add(id(p))
                kept.append(p)
        if kept:
            out.append(kept)
    return out


def split_units(units: Sequence[list[nn.Parameter]], fragments: int, where: str) -> list[list[nn.Parameter]]:
    """Cut ``units`` (the layers in order) into ``fragments`` runs of consecutive units, as equal in count as
    possible (earlier fragments get the extra unit); ``where`` says what the units are, for the message."""
    L = len(units)
    if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= L:
        raise ValueError(
            f"{FIELD}: got {fragments!r}; the model has {L} {where}, so allowed: an integer from 1 to {L} "
            "(a fragment is a group of whole layers)"
        )
    base, extra = divmod(L, fragments)
    out, start = [], 0
    for p in range(fragments):
        n = base + (1 if p < extra else 0)
        out.append([q for unit in units[start : start + n] for q in unit])
        start += n
    return out


FragmentSpec = Sequence[Union[nn.Module, nn.Parameter, Sequence[Union[nn.Module, nn.Parameter]]]]


def explicit_fragments(spec: FragmentSpec, model: nn.Module, fragments: int) -> list[list[nn.Parameter]]:
    """Fragments given by the caller: one entry per fragment, each modules and/or parameters, every
    trainable parameter of ``model`` in exactly one."""
    if len(spec) != fragments:
        raise ValueError(f"{FIELD}: got {fragments}, but {len(spec)} explicit fragments were passed")
    out: list[list[nn.Parameter]] = []
    owner: dict[int, int] = {}
    for i, entry in enumerate(spec):
        items = [entry] if isinstance(entry, (nn.Module, nn.Parameter)) else list(entry)
        params: list[nn.Parameter] = []
        for item in items:
            for p in _trainable(item) if isinstance(item, nn.Module) else [item]:
                if id(p) in owner and owner[id(p)] != i:
                    raise ValueError(f"fragments: a parameter is in fragment {owner[id(p)]} and fragment {i}")
                if id(p) not in owner:
                    owner[id(p)] = i
                    params.append(p)
        if not params:
            raise ValueError(f"fragments: fragment {i} has no trainable parameters")
        out.append(params)
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in owner]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ValueError(f"fragments: trainable parameters in no fragment: {missing[:5]}{more}")
    return out


def named_fragments(names: Sequence[Sequence[str]], model: nn.Module, fragments: int) -> list[list[nn.Parameter]]:
    """Fragments given by qualified names of modules or parameters (``acco.streaming.fragment_modules``)."""
    spec: list[list[Union[nn.Module, nn.Parameter]]] = []
    for i, entry in enumerate(names):
        items: list[Union[nn.Module, nn.Parameter]] = []
        for j, name in enumerate(entry):
            try:
                items.append(model.get_submodule(name) if name else model)
            except AttributeError:
                try:
                    items.append(model.get_parameter(name))
                except AttributeError:
                    top = ", ".join(n for n, _ in model.named_children())
                    raise ValueError(
                        f"acco.streaming.fragment_modules[{i}][{j}]: got {name!r}; no module or parameter of "
                        f"{type(model).__name__} has that name (top-level modules: {top})"
                    ) from None
        spec.append(items)
    try:
        return explicit_fragments(spec, model, fragments)
    except ValueError as exc:
        raise ValueError(f"acco.streaming.fragment_modules: {exc}") from None
