"""Model shapes read from a Hugging Face ``config.json``, for the 3D-parallel planner.

Whoever plans a training run usually has the model's Hugging Face config at hand
rather than Megatron-LM's argument names. :func:`model_fields_from_huggingface`
reads the fields a family's ``PretrainedConfig`` subclass defines (transformers,
``models/<family>/configuration_<family>.py``; the aliases of its ``attribute_map``
too) into the fields of :class:`partitioners.parallel3d.specs.ModelSpec`.

Families are told apart by ``model_type``, and an unknown one is refused rather
than guessed: the same key means different things across families (Llama's
``intermediate_size`` feeds a gated SwiGLU MLP, GPT-NeoX's a plain one; Mixtral's is
the expert width). Defaults are the config classes' own, since a ``config.json``
leaves out what equals them (GPT-NeoX ``use_parallel_residual``, Falcon
``parallel_attn``, the ``tie_word_embeddings`` each family sets). The one thing no
config says is the sequence length a run trains at (``max_position_embeddings`` is
the longest the model supports), so the request gives it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from partitioners.errors import InvalidInput
from partitioners.parallel3d.spec_fields import as_list, flag, positive_int

__all__ = ["HUGGINGFACE_MODEL_TYPES", "model_fields_from_huggingface"]


@dataclass(frozen=True)
class _Family:
    """Where one family's config keeps each shape field, and what it leaves implicit.

    Key fields name the config keys that may hold a value, first found wins (a
    class's own name, then its ``attribute_map`` aliases).
    """

    layers: tuple[str, ...] = ("num_hidden_layers",)
    hidden: tuple[str, ...] = ("hidden_size",)
    heads: tuple[str, ...] = ("num_attention_heads",)
    # None: multi-head attention (no GQA key in this family)
    kv_heads: tuple[str, ...] | None = ("num_key_value_heads",)
    # None: the MLP is 4 h wide
    ffn: tuple[str, ...] | None = ("intermediate_size",)
    gated_mlp: bool = True
    # parallel attention and MLP: the config key and its class default, or a fixed answer
    parallel_key: tuple[str, bool] | None = None
    tie_embeddings_default: bool = False
    learned_position_embeddings: bool = False
    # "mixtral", "llama4", "qwen_moe" or "deepseek": how the family describes its experts
    moe: str | None = None
    mla: bool = False
    # the config class's defaults for keys a nested config may leave out (a sub-config is
    # saved as its difference from them: LLaVA's text_config names no hidden_size)
    defaults: tuple[tuple[str, int], ...] = ()
    # Which layers attend locally when the config has no ``layer_types`` list (the rules
    # of :func:`_layer_kinds`): "all", "alternate", "pattern", "qwen" (sliding windows),
    # "no_rope" (Llama 4's chunks), or None (the family has neither).
    local_layers: str | None = None
    # the config class's default window, for a config that leaves the key out
    sliding_window_default: int | None = None


_LLAMA = _Family()
# transformers LlamaConfig.__init__ defaults (Llama-1/2-7B's shape)
_LLAMA_WITH_DEFAULTS = _Family(
    defaults=(
        ("vocab_size", 32000),
        ("hidden_size", 4096),
        ("intermediate_size", 11008),
        ("num_hidden_layers", 32),
        ("num_attention_heads", 32),
    )
)
_GPT2 = _Family(
    layers=("n_layer", "num_hidden_layers"),
    hidden=("n_embd", "hidden_size"),
    heads=("n_head", "num_attention_heads"),
    kv_heads=None,
    ffn=("n_inner",),
    gated_mlp=False,
    tie_embeddings_default=True,
    learned_position_embeddings=True,
)

_QWEN = _Family(local_layers="qwen")

_FAMILIES: dict[str, _Family] = {
    # SwiGLU/GeGLU decoders with Llama's key names
    "llama": _LLAMA_WITH_DEFAULTS,
    # MistralConfig's sliding_window defaults to 4096 (Mistral 7B v0.1; later versions set null)
    "mistral": _Family(local_layers="all", sliding_window_default=4096),
    "qwen2": _QWEN,
    "qwen3": _QWEN,
    "phi3": _Family(local_layers="all"),
    "olmo2": _LLAMA,
    "granite": _LLAMA,
    "gemma": _Family(tie_embeddings_default=True),
    "gemma2": _Family(tie_embeddings_default=True, local_layers="alternate", sliding_window_default=4096),
    # transformers Gemma3TextConfig.__init__ defaults: Gemma 3's multimodal configs save a
    # text_config with only what differs from them
    "gemma3_text": _Family(
        tie_embeddings_default=True,
        local_layers="pattern",
        defaults=(
            ("vocab_size", 262_208),
            ("hidden_size", 2304),
            ("intermediate_size", 9216),
            ("num_hidden_layers", 26),
            ("num_attention_heads", 8),
            ("num_key_value_heads", 4),
            ("head_dim", 256),
            ("sliding_window", 4096),
            ("sliding_window_pattern", 6),
        ),
    ),
    # Command-R: attention and MLP both read the layer's one norm output and are added together
    "cohere": _Family(parallel_key=("", True), tie_embeddings_default=True),
    # Command R7B / Command A: Command-R's block with 4096-token windows on three layers in
    # four (Cohere2Config: sliding_window_pattern 4)
    "cohere2": _Family(
        parallel_key=("", True),
        tie_embeddings_default=True,
        local_layers="pattern",
        sliding_window_default=4096,
        defaults=(("sliding_window_pattern", 4),),
    ),
    # plain (non-gated) MLPs under Llama's key names: squared ReLU, GELU
    "nemotron": _Family(gated_mlp=False),
    "starcoder2": _Family(gated_mlp=False, tie_embeddings_default=True, local_layers="all"),
    "gpt_neox": _Family(kv_heads=None, gated_mlp=False, parallel_key=("use_parallel_residual", True)),
    # GPT-2 and its descendants: learned positions, tied output layer, 4 h MLP unless n_inner
    "gpt2": _GPT2,
    "gpt_bigcode": _GPT2,  # StarCoder: multi_query (default on) is one KV head, read below
    "opt": _Family(
        kv_heads=None, ffn=("ffn_dim",), gated_mlp=False, tie_embeddings_default=True, learned_position_embeddings=True
    ),
    "bloom": _Family(
        layers=("n_layer", "num_hidden_layers"),
        hidden=("hidden_size", "n_embed"),
        heads=("n_head", "num_attention_heads"),
        kv_heads=None,
        ffn=None,
        gated_mlp=False,
        tie_embeddings_default=True,
    ),
    # Falcon: kv heads from new_decoder_architecture / multi_query, read below
    "falcon": _Family(
        layers=("num_hidden_layers", "n_layer"),
        hidden=("hidden_size", "n_embed"),
        heads=("num_attention_heads", "n_head"),
        kv_heads=None,
        ffn=("ffn_hidden_size",),
        gated_mlp=False,
        parallel_key=("parallel_attn", True),
        tie_embeddings_default=True,
    ),
    # Mixture-of-Experts families
    # Llama 4 (Scout, Maverick): every interleave_moe_layer_step-th layer routes top-k over
    # experts of intermediate_size plus one shared expert of that width, the others are
    # dense MLPs of intermediate_size_mlp; chunked attention on the rotary layers.
    # Llama4TextConfig's defaults are Scout's shape.
    "llama4_text": _Family(
        ffn=("intermediate_size_mlp",),
        moe="llama4",
        local_layers="no_rope",
        defaults=(
            ("vocab_size", 202_048),
            ("hidden_size", 5120),
            ("intermediate_size", 8192),
            ("intermediate_size_mlp", 16384),
            ("num_hidden_layers", 48),
            ("num_attention_heads", 40),
            ("num_key_value_heads", 8),
            ("head_dim", 128),
            ("num_experts_per_tok", 1),
            ("num_local_experts", 16),
            ("interleave_moe_layer_step", 1),
            ("attention_chunk_size", 8192),
            ("no_rope_layer_interval", 4),
        ),
    ),
    "mixtral": _Family(moe="mixtral", local_layers="all"),
    # gpt-oss: Mixtral's expert keys (num_experts an alias), a SwiGLU expert as wide as
    # the hidden size, 128-token windows on every other layer; GptOssConfig's defaults
    # are gpt-oss-120b's shape
    "gpt_oss": _Family(
        moe="mixtral",
        local_layers="alternate",
        sliding_window_default=128,
        defaults=(
            ("num_hidden_layers", 36),
            ("num_local_experts", 128),
            ("vocab_size", 201_088),
            ("hidden_size", 2880),
            ("intermediate_size", 2880),
            ("head_dim", 64),
            ("num_attention_heads", 64),
            ("num_key_value_heads", 8),
            ("num_experts_per_tok", 4),
        ),
    ),
    "qwen2_moe": _Family(moe="qwen_moe", local_layers="qwen"),
    "qwen3_moe": _Family(moe="qwen_moe", local_layers="qwen"),
    # GLM-4.5/4.6: DeepSeek-V3's expert keys and multi-token prediction with GQA attention
    # (heads of head_dim, 96 x 128 against a 5120-wide hidden state)
    "glm4_moe": _Family(moe="deepseek"),
    "deepseek_v2": _Family(kv_heads=None, moe="deepseek", mla=True),
    "deepseek_v3": _Family(kv_heads=None, moe="deepseek", mla=True),
}

HUGGINGFACE_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


class _Config:
    """A config object read with its dotted request path in every error."""

    def __init__(self, data: Mapping[str, Any], where: str, defaults: Mapping[str, int]) -> None:
        self.data = data
        self.where = where
        self.defaults = defaults

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def first_key(self, keys: tuple[str, ...]) -> str | None:
        return next((key for key in keys if self.has(key)), None)

    def gives(self, keys: tuple[str, ...]) -> bool:
        """Whether the config, or its class's defaults, has a value under one of ``keys``."""
        return self.first_key(keys) is not None or keys[0] in self.defaults

    def required_int(self, keys: tuple[str, ...] | str, *, allow_zero: bool = False) -> int:
        keys = (keys,) if isinstance(keys, str) else keys
        key = self.first_key(keys)
        if key is None and keys[0] in self.defaults:
            return self.defaults[keys[0]]
        if key is None:
            raise InvalidInput(
                f"{self.where}.{keys[0]} is required for model_type {self.data.get('model_type')!r}",
                field=f"{self.where}.{keys[0]}",
                code="missing-field",
            )
        return positive_int(self.data[key], f"{self.where}.{key}", allow_zero=allow_zero)

    @overload
    def optional_int(self, keys: tuple[str, ...] | str, default: int, *, allow_zero: bool = False) -> int: ...
    @overload
    def optional_int(
        self, keys: tuple[str, ...] | str, default: None = None, *, allow_zero: bool = False
    ) -> int | None: ...
    def optional_int(
        self, keys: tuple[str, ...] | str, default: int | None = None, *, allow_zero: bool = False
    ) -> int | None:
        keys = (keys,) if isinstance(keys, str) else keys
        return self.required_int(keys, allow_zero=allow_zero) if self.gives(keys) else default

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        return default if value is None else flag(value, f"{self.where}.{key}")

    def int_list(self, key: str) -> list[int]:
        if not self.has(key):
            return []
        return [
            positive_int(x, f"{self.where}.{key}[]", allow_zero=True)
            for x in as_list(self.data[key], f"{self.where}.{key}", "a list of layer indices")
        ]


def _text_config(data: Any, where: str) -> _Config:
    """The language model's config: the document itself, or its ``text_config`` (LLaVA, Gemma 3, ...)."""
    for _ in range(4):  # a wrapper of a wrapper at most
        if not isinstance(data, Mapping):
            raise InvalidInput(
                f"{where} must be an object (the model's config.json)", field=where, code="not-an-object"
            )
        model_type = data.get("model_type")
        if isinstance(model_type, str) and model_type in _FAMILIES:
            return _Config(data, where, dict(_FAMILIES[model_type].defaults))
        if not isinstance(data.get("text_config"), Mapping):
            break
        data, where = data["text_config"], f"{where}.text_config"
    raise InvalidInput(
        f"{where}.model_type {data.get('model_type')!r} is not one hyperplace reads "
        f"({', '.join(HUGGINGFACE_MODEL_TYPES)}); describe the model by its shape fields instead",
        field=f"{where}.model_type",
        code="unknown-model-type",
    )


def _kv_heads(config: _Config, family: _Family, model_type: str, heads: int) -> int | None:
    if model_type == "falcon":
        # FalconConfig: num_kv_heads counts only with new_decoder_architecture (40B, 180B);
        # otherwise multi_query (default on, Falcon-7B) means one KV head
        if config.flag("new_decoder_architecture", False):
            return config.optional_int(("num_kv_heads", "n_head_kv"), heads)
        return 1 if config.flag("multi_query", True) else None
    if model_type == "gpt_bigcode":
        return 1 if config.flag("multi_query", True) else None
    if family.kv_heads is None:
        return None
    return config.optional_int(family.kv_heads)


def _moe_block(config: _Config, family: _Family, num_layers: int) -> dict[str, Any]:
    """The ``model.moe`` block, with the MoE layers each family's modelling code builds."""
    if family.moe == "mixtral":
        # every layer routes over num_local_experts experts of intermediate_size
        return {
            "num_experts": config.required_int(("num_local_experts", "num_experts")),
            "experts_per_token": config.required_int("num_experts_per_tok"),
            "expert_ffn_hidden_size": config.required_int("intermediate_size"),
        }
    if family.moe == "llama4":
        # Llama4TextMoe: the routed experts and a shared_expert MLP of intermediate_size;
        # moe_layers, or every interleave_moe_layer_step-th layer counting from the step's last
        step = config.optional_int("interleave_moe_layer_step", 1)
        layers = config.int_list("moe_layers") if config.has("moe_layers") else list(range(step - 1, num_layers, step))
        block: dict[str, Any] = {
            "num_experts": config.required_int("num_local_experts"),
            "experts_per_token": config.required_int("num_experts_per_tok"),
            "expert_ffn_hidden_size": config.required_int("intermediate_size"),
            "shared_experts": 1,
        }
        if len(set(layers)) < num_layers:
            block["moe_layers"] = layers
        return block
    if family.moe == "qwen_moe":
        # Qwen2MoeDecoderLayer: sparse when the layer is not in mlp_only_layers and
        # (index + 1) % decoder_sparse_step == 0; one shared expert of
        # shared_expert_intermediate_size (Qwen2-MoE), i.e. that many expert widths
        expert_width = config.required_int("moe_intermediate_size")
        step = config.optional_int("decoder_sparse_step", 1)
        dense_only = set(config.int_list("mlp_only_layers"))
        if any(index >= num_layers for index in dense_only):
            raise InvalidInput(
                f"{config.where}.mlp_only_layers names layer {max(dense_only)} of a {num_layers}-layer model",
                field=f"{config.where}.mlp_only_layers",
                code="layer-out-of-range",
            )
        block = {
            "num_experts": config.required_int("num_experts"),
            "experts_per_token": config.required_int("num_experts_per_tok"),
            "expert_ffn_hidden_size": expert_width,
        }
        shared_width = config.optional_int("shared_expert_intermediate_size", 0, allow_zero=True)
        if shared_width:
            if shared_width % expert_width:
                raise InvalidInput(
                    f"{config.where}.shared_expert_intermediate_size {shared_width} is not a multiple "
                    f"of moe_intermediate_size {expert_width}: hyperplace counts shared experts in "
                    "routed-expert widths",
                    field=f"{config.where}.shared_expert_intermediate_size",
                    code="shared-expert-width",
                )
            block["shared_experts"] = shared_width // expert_width
        layers = [i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0]
        if len(layers) < num_layers:
            block["moe_layers"] = layers
        return block
    # DeepSeek-V2/V3: the first first_k_dense_replace layers are dense, then every
    # moe_layer_freq-th; n_group / topk_group limit a token's experts to its best groups
    first_dense = config.optional_int("first_k_dense_replace", 0, allow_zero=True)
    freq = config.optional_int("moe_layer_freq", 1)
    block = {
        "num_experts": config.required_int("n_routed_experts"),
        "experts_per_token": config.required_int("num_experts_per_tok"),
        "expert_ffn_hidden_size": config.required_int("moe_intermediate_size"),
        "shared_experts": config.optional_int("n_shared_experts", 0, allow_zero=True),
    }
    layers = [i for i in range(num_layers) if i >= first_dense and i % freq == 0]
    if len(layers) < num_layers:
        block["moe_layers"] = layers
    groups = config.optional_int("n_group", 1)
    if groups > 1:
        block["num_groups"] = groups
        block["group_topk"] = config.required_int("topk_group")
    return block


_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def _check_one_per_layer(config: _Config, key: str, values: Sequence[Any], num_layers: int) -> None:
    if len(values) != num_layers:
        raise InvalidInput(
            f"{config.where}.{key} names {len(values)} layers, num_hidden_layers is {num_layers}",
            field=f"{config.where}.{key}",
            code="layer-count-mismatch",
        )


def _layer_kinds(config: _Config, family: _Family, num_layers: int) -> list[str]:
    """Each layer's attention kind: from ``layer_types`` where the config has it, else by the family's rule.

    A ``layer_types`` list (transformers' newer configs) names each layer's attention;
    a kind hyperplace does not model (linear, ...) is refused by its index. Otherwise:
    Mistral, Mixtral, Phi-3 and StarCoder2 window every layer; Gemma 2 and gpt-oss the
    even ones (``is_sliding = not bool(layer_idx % 2)``); Gemma 3 and Cohere 2 all but
    every ``sliding_window_pattern``-th (5 or 3 local to 1 global); Qwen 2/3 only with
    ``use_sliding_window``, from ``max_window_layers`` on; Llama 4 chunks the layers
    with rotary embeddings (``no_rope_layers``; by default all but every
    ``no_rope_layer_interval``-th).
    """
    if config.has("layer_types"):
        kinds = as_list(config.data["layer_types"], f"{config.where}.layer_types", "a list of attention kinds")
        _check_one_per_layer(config, "layer_types", kinds, num_layers)
        for index, kind in enumerate(kinds):
            if kind not in _LAYER_TYPES:
                raise InvalidInput(
                    f"{config.where}.layer_types[{index}] {kind!r} is not an attention hyperplace "
                    f"models ({', '.join(_LAYER_TYPES)})",
                    field=f"{config.where}.layer_types",
                    code="unknown-attention-kind",
                )
        return list(kinds)
    rule, local = family.local_layers, "sliding_attention"
    chosen: Sequence[int]
    if rule == "all":
        chosen = range(num_layers)
    elif rule == "alternate":
        chosen = range(0, num_layers, 2)
    elif rule == "pattern":
        pattern = config.required_int("sliding_window_pattern")
        chosen = [i for i in range(num_layers) if (i + 1) % pattern]
    elif rule == "qwen":
        first = config.optional_int("max_window_layers", 0, allow_zero=True)
        chosen = range(first, num_layers) if config.flag("use_sliding_window", False) else []
    else:  # "no_rope": Llama 4
        local = "chunked_attention"
        if config.has("no_rope_layers"):
            uses_rope = config.int_list("no_rope_layers")
            _check_one_per_layer(config, "no_rope_layers", uses_rope, num_layers)
            chosen = [i for i, rope in enumerate(uses_rope) if rope]
        else:
            interval = config.optional_int("no_rope_layer_interval", 4)
            chosen = [i for i in range(num_layers) if (i + 1) % interval]
    kinds = ["full_attention"] * num_layers
    for index in chosen:
        kinds[index] = local
    return kinds


def _local_attention(config: _Config, family: _Family, num_layers: int) -> dict[str, Any]:
    """``sliding_window`` / ``attention_chunk_size`` and the layers they apply to, as the family's code applies them."""
    if family.local_layers is None:
        # the family's code attends fully everywhere: a layer_types list may only say so
        if config.has("layer_types"):
            for index, kind in enumerate(_layer_kinds(config, family, num_layers)):
                if kind != "full_attention":
                    raise InvalidInput(
                        f"{config.where}.layer_types[{index}] is {kind!r}, but "
                        f"{config.data['model_type']} layers all attend fully",
                        field=f"{config.where}.layer_types",
                        code="unknown-attention-kind",
                    )
        return {}
    sizes: dict[str, int | None] = {}
    for key, default in (("sliding_window", family.sliding_window_default), ("attention_chunk_size", None)):
        if key in config.data:  # null: none (Mistral v0.2 on), whatever the class default
            sizes[key] = None if config.data[key] is None else config.required_int(key)
        else:
            sizes[key] = config.defaults.get(key, default)
    kinds = _layer_kinds(config, family, num_layers)
    fields: dict[str, Any] = {}
    for kind, size_key, layers_key in (
        ("sliding_attention", "sliding_window", "sliding_window_layers"),
        ("chunked_attention", "attention_chunk_size", "chunked_attention_layers"),
    ):
        layers = [i for i, layer_kind in enumerate(kinds) if layer_kind == kind]
        if layers and sizes[size_key] is None and kind == "chunked_attention":
            raise InvalidInput(
                f"{config.where}.attention_chunk_size is required for the chunked_attention layers",
                field=f"{config.where}.attention_chunk_size",
                code="missing-field",
            )
        if not layers or sizes[size_key] is None:  # a null sliding_window attends to everything
            continue
        fields[size_key] = sizes[size_key]
        if len(layers) < num_layers:
            fields[layers_key] = layers
    return fields


def model_fields_from_huggingface(config: Any, where: str = "model.huggingface_config") -> dict[str, Any]:
    """The planner's model fields (all but ``seq_length``) for a Hugging Face ``config.json``.

    Parameters
    ----------
    config : Mapping
        The parsed ``config.json`` (or its ``text_config`` holder), with ``model_type``.
    where : str
        The config's dotted path in the request, for error fields.

    Raises
    ------
    InvalidInput
        An unknown ``model_type``, or a required key missing or not a positive
        integer, named by its path (``model.huggingface_config.num_hidden_layers``).
    """
    cfg = _text_config(config, where)
    model_type = cfg.data["model_type"]
    family = _FAMILIES[model_type]
    num_layers = cfg.required_int(family.layers)
    hidden = cfg.required_int(family.hidden)
    heads = cfg.required_int(family.heads)
    fields: dict[str, Any] = {
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "vocab_size": cfg.required_int("vocab_size"),
        "gated_mlp": family.gated_mlp,
        "tie_embeddings": cfg.flag("tie_word_embeddings", family.tie_embeddings_default),
        "learned_position_embeddings": family.learned_position_embeddings,
    }
    if family.ffn is not None and cfg.gives(family.ffn):
        fields["ffn_hidden_size"] = cfg.required_int(family.ffn)
    if family.parallel_key is not None:
        key, default = family.parallel_key
        fields["parallel_attention_mlp"] = cfg.flag(key, default) if key else default
    # any config that states an MLA latent (DeepSeek-V2/V3, and the models built on them
    # under other model types) is read as MLA
    if family.mla or cfg.gives(("kv_lora_rank",)):
        fields["mla"] = {
            "q_lora_rank": cfg.optional_int("q_lora_rank"),
            "kv_lora_rank": cfg.required_int("kv_lora_rank"),
            "qk_nope_head_dim": cfg.required_int("qk_nope_head_dim"),
            "qk_rope_head_dim": cfg.required_int("qk_rope_head_dim", allow_zero=True),
            "v_head_dim": cfg.required_int("v_head_dim"),
        }
    else:
        kv_heads = _kv_heads(cfg, family, model_type, heads)
        if kv_heads is not None:
            fields["num_kv_heads"] = kv_heads
        head_dim = cfg.optional_int("head_dim")
        if head_dim is not None and head_dim * heads != hidden:
            fields["head_dim"] = head_dim
    if family.moe is not None:
        fields["moe"] = _moe_block(cfg, family, num_layers)
    if family.moe == "deepseek":
        fields["mtp_layers"] = cfg.optional_int("num_nextn_predict_layers", 0, allow_zero=True)
    fields.update(_local_attention(cfg, family, num_layers))
    return fields
