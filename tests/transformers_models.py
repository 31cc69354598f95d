"""Tiny random-init `transformers` architectures, exported with `torch.export` to `.pt2` files the
way a user saves them (keyword inputs, a dynamic batch, the model's own output class)."""

from __future__ import annotations

from pathlib import Path

import torch


def _text(cls, **kw):
    return cls(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **kw)


def _ids(n: int = 8):
    return torch.randint(0, 99, (2, n))


def _swin(head: bool):
    import transformers as T

    cfg = T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3)
    return (T.SwinForImageClassification if head else T.SwinModel)(cfg), {"pixel_values": torch.randn(2, 3, 32, 32)}


def _t5(encoder_only: bool):
    import transformers as T

    cfg = T.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2, num_heads=4,
                     decoder_start_token_id=0, use_cache=False)
    if encoder_only:
        return T.T5EncoderModel(cfg), {"input_ids": _ids()}
    return T.T5ForConditionalGeneration(cfg), {"input_ids": _ids(), "decoder_input_ids": _ids(4)}


def _bert():
    import transformers as T

    return (T.BertModel(_text(T.BertConfig, max_position_embeddings=64)),
            {"input_ids": _ids(), "attention_mask": torch.ones(2, 8, dtype=torch.long)})


def _decoder(cls_name: str):
    import transformers as T

    cfg = _text(getattr(T, f"{cls_name}Config"), num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return getattr(T, f"{cls_name}Model")(cfg), {"input_ids": _ids()}


def _segformer():
    import transformers as T

    cfg = T.SegformerConfig(image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                            num_attention_heads=[1, 2], decoder_hidden_size=16, num_labels=3, patch_sizes=[7, 3],
                            strides=[4, 2], mlp_ratios=[2, 2])
    return T.SegformerForSemanticSegmentation(cfg), {"pixel_values": torch.randn(2, 3, 32, 32)}


def _wav2vec2():
    import transformers as T

    cfg = T.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=2)
    return T.Wav2Vec2Model(cfg), {"input_values": torch.randn(2, 400)}


def _clip(part: str):
    import transformers as T

    if part == "text":
        cfg = T.CLIPTextConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                               max_position_embeddings=32, bos_token_id=0, eos_token_id=2, pad_token_id=1)
        return T.CLIPTextModel(cfg), {"input_ids": _ids()}
    cfg = T.CLIPVisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=32, patch_size=8)
    return T.CLIPVisionModel(cfg), {"pixel_values": torch.randn(2, 3, 32, 32)}


def _whisper_encoder():
    import transformers as T

    cfg = T.WhisperConfig(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, num_mel_bins=16,
                          max_source_positions=30, max_target_positions=32, pad_token_id=0, bos_token_id=1,
                          eos_token_id=2, decoder_start_token_id=1)
    return T.WhisperModel(cfg).get_encoder(), {"input_features": torch.randn(2, 16, 60)}


BUILDERS = {
    "swin": lambda: _swin(False),
    "swin_cls": lambda: _swin(True),
    "t5_encoder": lambda: _t5(True),
    "t5": lambda: _t5(False),
    "bert": _bert,
    "llama": lambda: _decoder("Llama"),
    "qwen2": lambda: _decoder("Qwen2"),
    "segformer": _segformer,
    "wav2vec2": _wav2vec2,
    "clip_text": lambda: _clip("text"),
    "clip_vision": lambda: _clip("vision"),
    "whisper_encoder": _whisper_encoder,
}


def build(name: str):
    """(the model in eval mode, its keyword sample inputs), seeded."""
    torch.manual_seed(0)
    model, inputs = BUILDERS[name]()
    return model.eval(), inputs


def export_pt2(name: str, folder: Path) -> Path:
    """`folder/NAME.pt2`: the model exported with its keyword inputs and a dynamic batch (1..64)."""
    model, inputs = build(name)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (), inputs, dynamic_shapes={k: {0: batch} for k in inputs}, strict=False)
    path = Path(folder) / f"{name}.pt2"
    torch.export.save(ep, str(path))
    return path
