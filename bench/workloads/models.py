"""Real model shapes for the workload drivers (bench/workloads/workloads.py).

Every model is built from a torch module definition and moved to the "meta" device, so only its
layout (names, shapes, dtypes) is kept; the drivers fill the tensors with random data.

  resnet50   torchvision.models.resnet50()              25.6 M parameters, 161 state-dict entries
  vit_b_16   torchvision.models.vit_b_16()              86.6 M parameters
  bert_base  BERT-base from torch.nn modules            109.5 M parameters
  gpt2_small GPT-2 small (124M) from torch.nn modules   124.4 M parameters

`transformers` is not installed here (and nothing is downloaded), so BERT-base and GPT-2 small are
built faithfully from torch.nn modules with the published dimensions:
  BERT-base: 12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30522, 512 positions, 2 token
    types, embedding LayerNorm, a 768x768 pooler. Each encoder layer is an nn.TransformerEncoderLayer
    (its attention packs Q, K and V into one 2304x768 in_proj_weight, where Hugging Face keeps three
    768x768 matrices: the same bytes).
  GPT-2 small: 12 blocks, width 768, 12 heads, MLP 3072, vocabulary 50257, context 1024, final
    LayerNorm; the LM head is tied to the token embedding (as in GPT-2), so it is not a separate
    state-dict entry. Hugging Face's Conv1D stores its weights transposed ([in, out]); nn.Linear
    stores [out, in]: the same bytes.

NAS families (regularized evolution in workloads.py mutates these genes):
  resnet50 family: one gene per bottleneck block (16): the width multiplier of its 3x3 convolution
    (torchvision's Bottleneck(base_width=64*m): conv1/bn1/conv2/bn2/conv3 change shape; the block's
    output width does not). Genome (1.0,)*16 is torchvision's ResNet-50.
  vit_b_16 family: one gene per encoder layer (12): its MLP width (torchvision's EncoderBlock(...,
    mlp_dim)). Genome (3072,)*12 is torchvision's ViT-B/16.
"""
from __future__ import annotations

import copy
import functools
from collections import OrderedDict
from typing import Dict, Sequence, Tuple

import numpy as np
import torch
from torch import nn

MODELS = ("resnet50", "vit_b_16", "bert_base", "gpt2_small")

_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.float64: np.float64}


class BertBase(nn.Module):
    """BERT-base encoder (no task head) with the published dimensions (see the module docstring)."""

    def __init__(self, device: str = "meta") -> None:
        super().__init__()
        d = 768
        kw = {"device": device}
        self.word_embeddings = nn.Embedding(30522, d, **kw)
        self.position_embeddings = nn.Embedding(512, d, **kw)
        self.token_type_embeddings = nn.Embedding(2, d, **kw)
        self.embeddings_norm = nn.LayerNorm(d, eps=1e-12, **kw)
        self.encoder = nn.ModuleList([
            nn.TransformerEncoderLayer(d, 12, dim_feedforward=3072, activation="gelu", batch_first=True,
                                       layer_norm_eps=1e-12, **kw) for _ in range(12)])
        self.pooler = nn.Linear(d, d, **kw)


class Gpt2Block(nn.Module):
    def __init__(self, d: int, device: str) -> None:
        super().__init__()
        kw = {"device": device}
        self.ln_1 = nn.LayerNorm(d, **kw)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(d, 3 * d, **kw), "c_proj": nn.Linear(d, d, **kw)})
        self.ln_2 = nn.LayerNorm(d, **kw)
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(d, 4 * d, **kw), "c_proj": nn.Linear(4 * d, d, **kw)})


class Gpt2Small(nn.Module):
    """GPT-2 small (124M) with the published dimensions; LM head tied to wte (not a separate entry)."""

    def __init__(self, device: str = "meta") -> None:
        super().__init__()
        d = 768
        self.wte = nn.Embedding(50257, d, device=device)
        self.wpe = nn.Embedding(1024, d, device=device)
        self.h = nn.ModuleList([Gpt2Block(d, device) for _ in range(12)])
        self.ln_f = nn.LayerNorm(d, device=device)


@functools.lru_cache(maxsize=None)
def _reference(name: str) -> nn.Module:
    import torchvision  # only for the two vision models

    if name == "resnet50":
        return torchvision.models.resnet50().to("meta")
    if name == "vit_b_16":
        return torchvision.models.vit_b_16().to("meta")
    if name == "bert_base":
        return BertBase("meta")
    if name == "gpt2_small":
        return Gpt2Small("meta")
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def module(name: str) -> nn.Module:
    """A fresh meta-device copy of model `name` (layout only, no storage)."""
    return copy.deepcopy(_reference(name))


Layout = "OrderedDict[str, Tuple[Tuple[int, ...], np.dtype]]"


def layout_of(m: nn.Module) -> Layout:
    return OrderedDict((k, (tuple(v.shape), np.dtype(_NP[v.dtype]))) for k, v in m.state_dict().items())


def layout(name: str) -> Layout:
    return layout_of(_reference(name))


def nbytes(lay: Layout) -> int:
    return sum(int(np.prod(s, dtype=np.int64)) * dt.itemsize for s, dt in lay.values())


def random_tensor(shape: Tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    if dtype == np.float32:
        # Random bits with the sign and mantissa kept and the exponent fixed: finite values of
        # magnitude 2^-7..2^-6, every tensor different (no chunk repeats by accident), ~6x faster
        # than standard_normal.
        bits = rng.integers(0, 2**32, size=shape, dtype=np.uint32)
        bits &= np.uint32(0x807FFFFF)
        bits |= np.uint32(0x3C000000)
        return bits.view(np.float32)
    if dtype.kind == "f":
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype, copy=False)
    return np.asarray(rng.integers(0, 1000, size=shape, dtype=dtype), dtype=dtype)


def random_state(lay: Layout, seed: int, names: Sequence[str] = None) -> Dict[str, np.ndarray]:
    """Random tensors for `names` (default: every tensor of the layout), reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    return {k: random_tensor(lay[k][0], lay[k][1], rng) for k in (names if names is not None else lay)}


# ---- NAS families ----

RESNET_BLOCKS = 16  # ResNet-50: 3 + 4 + 6 + 3 bottleneck blocks
VIT_LAYERS = 12


def family_genes(family: str) -> int:
    return {"resnet50": RESNET_BLOCKS, "vit_b_16": VIT_LAYERS}[family]


def family_reference_gene(family: str):
    return {"resnet50": 1.0, "vit_b_16": 3072}[family]


def family_module(family: str, genome: Sequence) -> nn.Module:
    """A meta-device module of the family with the given genome (see the module docstring)."""
    if family == "resnet50":
        from torchvision.models.resnet import Bottleneck

        m = module("resnet50")
        blocks = [(s, i) for s in ("layer1", "layer2", "layer3", "layer4") for i in range(len(getattr(m, s)))]
        assert len(genome) == len(blocks)
        for (stage, i), mult in zip(blocks, genome):
            if mult == 1.0:
                continue
            old = getattr(m, stage)[i]
            inplanes = old.conv1.in_channels
            planes = old.conv3.out_channels // Bottleneck.expansion
            new = Bottleneck(inplanes, planes, stride=old.stride, downsample=old.downsample,
                             base_width=int(round(64 * mult)))
            getattr(m, stage)[i] = new.to("meta")
        return m
    if family == "vit_b_16":
        from torchvision.models.vision_transformer import EncoderBlock

        m = module("vit_b_16")
        layers = m.encoder.layers
        assert len(genome) == len(layers)
        for i, mlp in enumerate(genome):
            if mlp == 3072:
                continue
            name = f"encoder_layer_{i}"
            setattr(layers, name, EncoderBlock(12, 768, int(mlp), 0.0, 0.0).to("meta"))
        return m
    raise ValueError(f"unknown NAS family {family!r} (known: resnet50, vit_b_16)")


def family_block_prefix(family: str, gene: int) -> str:
    """The state-dict prefix of the block a gene controls."""
    if family == "resnet50":
        sizes = (3, 4, 6, 3)
        for s, n in enumerate(sizes):
            if gene < n:
                return f"layer{s + 1}.{gene}."
            gene -= n
        raise IndexError(gene)
    return f"encoder.layers.encoder_layer_{gene}."
