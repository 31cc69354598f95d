"""Keras zoo architectures, built locally with seeded random weights (no downloads).

Each builder returns a Functional `keras.Model` whose input names match the zoo entry. Batch
normalisation layers get non-trivial moving statistics so that conversions are really checked.
"""

from __future__ import annotations

from pathlib import Path


def _keras(seed: int):
    from modelport.parsers.tf_common import import_tf

    import_tf("Keras zoo models")
    import keras

    keras.utils.set_random_seed(seed)
    return keras


def _randomize_bn(model, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if type(layer).__name__ == "BatchNormalization":
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([
                rng.uniform(0.5, 1.5, gamma.shape).astype("float32"), rng.normal(0, 0.1, beta.shape).astype("float32"),
                rng.normal(0, 0.1, mean.shape).astype("float32"), rng.uniform(0.5, 1.5, var.shape).astype("float32"),
            ])
    return model


def keras_cnn(seed: int = 0, size: int = 32, classes: int = 10):
    """Conv/BN/ReLU blocks with a residual connection, global pooling and a dense head (NHWC)."""
    keras = _keras(seed)
    layers = keras.layers
    x_in = keras.Input((size, size, 3), name="image")
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(x_in)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    y = layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    x = layers.ReLU()(layers.Add()([x, y]))
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(32, activation="relu")(x)
    out = layers.Dense(classes, name="logits")(x)
    return _randomize_bn(keras.Model(x_in, out, name="keras_cnn"), seed)


def mobilenet_v2(seed: int = 0, size: int = 32, classes: int = 10, alpha: float = 0.35):
    """keras.applications.MobileNetV2 with weights=None (a real architecture, nothing downloaded)."""
    keras = _keras(seed)
    base = keras.applications.MobileNetV2(input_shape=(size, size, 3), alpha=alpha, weights=None, classes=classes)
    x_in = keras.Input((size, size, 3), name="image")
    return _randomize_bn(keras.Model(x_in, base(x_in), name="mobilenet_v2"), seed)


def keras_rnn(seed: int = 0, features: int = 6, classes: int = 3):
    """An LSTM (full sequence) feeding a GRU (last state) and a dense head; the time axis is dynamic."""
    keras = _keras(seed)
    layers = keras.layers
    x_in = keras.Input((None, features), name="sequence")
    x = layers.LSTM(16, return_sequences=True)(x_in)
    x = layers.GRU(16)(x)
    out = layers.Dense(classes, name="scores")(x)
    return keras.Model(x_in, out, name="keras_rnn")


def keras_transformer(seed: int = 0, vocab: int = 100, length: int = 16, dim: int = 32, heads: int = 4):
    """One transformer encoder block over int32 token ids: embedding, self-attention, FFN, LayerNorms."""
    keras = _keras(seed)
    layers = keras.layers
    ids = keras.Input((length,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, dim)(ids)
    attn = layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(x, x)
    x = layers.LayerNormalization(epsilon=1e-6)(layers.Add()([x, attn]))
    ffn = layers.Dense(dim, activation="gelu")(layers.Dense(dim * 2, activation="relu")(x))
    x = layers.LayerNormalization(epsilon=1e-6)(layers.Add()([x, ffn]))
    out = layers.Dense(4, name="classes")(layers.GlobalAveragePooling1D()(x))
    return keras.Model(ids, out, name="keras_transformer")


def keras_two_io(seed: int = 0):
    """Two inputs (an NHWC image and a feature vector), two outputs (class logits and a score)."""
    keras = _keras(seed)
    layers = keras.layers
    image = keras.Input((16, 16, 3), name="image")
    meta = keras.Input((8,), name="meta")
    x = layers.Conv2D(8, 3, activation="relu")(image)
    x = layers.GlobalAveragePooling2D()(x)
    h = layers.Concatenate()([x, layers.Dense(8, activation="relu")(meta)])
    logits = layers.Dense(5, name="logits")(h)
    score = layers.Dense(1, activation="sigmoid", name="score")(h)
    return keras.Model([image, meta], [logits, score], name="keras_two_io")


def save(model, entry, folder):
    """`model.keras`, the archive format users hand to `modelport convert`."""
    from modelport.parsers.tf_common import stdout_to_stderr

    path = Path(folder) / "model.keras"
    with stdout_to_stderr():
        model.save(str(path))
    return [path], "{dir}/model.keras --to onnx -o OUT"
