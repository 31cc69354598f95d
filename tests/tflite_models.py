"""Small TFLite files the tests build with TensorFlow's own converter (never checked in)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    return tf


def write_two_input_tflite(path: Path, *, signature: bool = False) -> Path:
    """Inputs a[batch,4,2] and b[batch,2]; y = sum(a, axis=1) * 10 + b. Without `signature` the file
    has no SignatureDef, like files from older converters."""
    tf = _tf()

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 2], tf.float32, name="a"), tf.TensorSpec([None, 2], tf.float32, name="b")])
    def f(a, b):
        return {"y": tf.reduce_sum(a, axis=1) * 10.0 + b}

    owner = tf.Module() if signature else None
    if owner is not None:
        owner.f = f
    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], owner).convert())
    return path


def write_int8_io_tflite(path: Path) -> Path:
    """A full-integer file whose input x[1,8] and output y are int8 tensors; y = 2x + 1."""
    tf = _tf()

    @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32, name="x")])
    def f(x):
        return {"y": x * 2.0 + 1.0}

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()])
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    conv.representative_dataset = lambda: ([rng.uniform(-1, 1, (1, 8)).astype(np.float32)] for _ in range(16))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    path.write_bytes(conv.convert())
    return path


def write_dense_tflite(path: Path) -> Path:
    """x[batch,16] → FULLY_CONNECTED(32) → ReLU → FULLY_CONNECTED(4) → y, float weights, with a
    signature: the weights a re-emission casts to float16 or quantises to int8."""
    tf = _tf()
    rng = np.random.default_rng(0)
    w1, b1 = tf.constant(rng.standard_normal((16, 32)).astype(np.float32) * 0.3), tf.constant(rng.standard_normal(32).astype(np.float32))
    w2, b2 = tf.constant(rng.standard_normal((32, 4)).astype(np.float32) * 0.3), tf.constant(rng.standard_normal(4).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def f(x):
        return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2}

    owner = tf.Module()
    owner.f = f
    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], owner).convert())
    return path


def write_dynamic_range_tflite(path: Path) -> Path:
    """A small Keras MLP x[batch,64] → Dense(128, relu) → Dense(64, relu) → Dense(10) → y, through the
    converter's dynamic-range quantisation (Optimize.DEFAULT, no representative dataset): the two
    larger kernels are stored in int8 and LiteRT's hybrid kernels quantise their float activations
    to int8 at run time; the last one (640 weights, under the converter's 1024) stays float."""
    tf = _tf()
    keras = tf.keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,), name="x"), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    path.write_bytes(conv.convert())
    return path


def write_dynamic_range_cnn_tflite(path: Path) -> Path:
    """image[batch,16,16,3] → Conv2D(48, 3, relu) → DepthwiseConv2D(3, relu) → global average pool →
    Dense(64, relu) → Dense(10) → y, through the converter's dynamic-range quantisation: the Conv2D
    (1,296 weights) and the first Dense (3,072) kernels are stored in int8 with a scale per output
    channel, the Dense layer quantises its activations at run time (tf2onnx writes that as
    DynamicQuantizeLinear → DequantizeLinear), and the smaller kernels stay float."""
    tf = _tf()
    keras = tf.keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16, 16, 3), name="image"), keras.layers.Conv2D(48, 3, activation="relu"),
                              keras.layers.DepthwiseConv2D(3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    path.write_bytes(conv.convert())
    return path
