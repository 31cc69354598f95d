"""modelport's own schema of Caffe's `caffe.proto`: the messages and fields the Caffe parser reads,
with BVLC Caffe's field numbers (and OpenCV's for the fields its caffe.proto adds: `permute_param`,
SSD's `norm_param` and `prior_box_param`, Pooling's `ceil_mode`, NVIDIA Caffe's fp16 `raw_data` and
BatchNorm's `scale_bias`), built at import time into a private descriptor pool.

Two top-level messages: `NetParameter`, what a `.prototxt` holds (read as text), and
`WeightsNet`, the part of a `.caffemodel` that matters here: each layer's name, type and blobs
(V2 `layer`, field 100, and legacy V1 `layers`, field 2). Reading a caffemodel through
`WeightsNet` leaves every other field unknown, so a fork's extra layer parameters never clash
with this schema.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {"string": F.TYPE_STRING, "bool": F.TYPE_BOOL, "float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE,
           "int32": F.TYPE_INT32, "int64": F.TYPE_INT64, "uint32": F.TYPE_UINT32, "uint64": F.TYPE_UINT64,
           "bytes": F.TYPE_BYTES}
PACKAGE = "modelport.caffe"

ENUMS = {
    "Phase": ["TRAIN", "TEST"],
    "Type": ["DOUBLE", "FLOAT", "FLOAT16", "INT", "UINT"],
    "Engine": ["DEFAULT", "CAFFE", "CUDNN"],
    "PoolMethod": ["MAX", "AVE", "STOCHASTIC"],
    "EltwiseOp": ["PROD", "SUM", "MAX"],
    "NormRegion": ["ACROSS_CHANNELS", "WITHIN_CHANNEL"],
    "VarianceNorm": ["FAN_IN", "FAN_OUT", "AVERAGE"],
    "DimCheckMode": ["STRICT", "PERMISSIVE"],
}
# V1LayerParameter's type enum: names and numbers (only read to say which legacy layer a file has)
V1_TYPES = {
    "NONE": 0, "ACCURACY": 1, "BNLL": 2, "CONCAT": 3, "CONVOLUTION": 4, "DATA": 5, "DROPOUT": 6, "EUCLIDEAN_LOSS": 7,
    "FLATTEN": 8, "HDF5_DATA": 9, "HDF5_OUTPUT": 10, "IM2COL": 11, "IMAGE_DATA": 12, "INFOGAIN_LOSS": 13,
    "INNER_PRODUCT": 14, "LRN": 15, "MULTINOMIAL_LOGISTIC_LOSS": 16, "POOLING": 17, "RELU": 18, "SIGMOID": 19,
    "SOFTMAX": 20, "SOFTMAX_LOSS": 21, "SPLIT": 22, "TANH": 23, "WINDOW_DATA": 24, "ELTWISE": 25, "POWER": 26,
    "SIGMOID_CROSS_ENTROPY_LOSS": 27, "HINGE_LOSS": 28, "MEMORY_DATA": 29, "ARGMAX": 30, "THRESHOLD": 31,
    "DUMMY_DATA": 32, "SLICE": 33, "MVN": 34, "ABSVAL": 35, "SILENCE": 36, "CONTRASTIVE_LOSS": 37, "EXP": 38,
    "DECONVOLUTION": 39,
}

# message -> [(field, number, type, label)]; label "?" optional, "*" repeated, "*p" repeated packed;
# a type that is not a scalar names a message, or an enum of ENUMS written as "enum:Name"
MESSAGES: dict[str, list[tuple]] = {
    "BlobShape": [("dim", 1, "int64", "*p")],
    "BlobProto": [("shape", 7, "BlobShape", "?"), ("data", 5, "float", "*p"), ("diff", 6, "float", "*p"),
                  ("double_data", 8, "double", "*p"), ("double_diff", 9, "double", "*p"),
                  ("raw_data_type", 10, "enum:Type", "?"), ("raw_data", 12, "bytes", "?"),
                  ("num", 1, "int32", "?"), ("channels", 2, "int32", "?"), ("height", 3, "int32", "?"),
                  ("width", 4, "int32", "?")],
    "NetState": [("phase", 1, "enum:Phase", "?"), ("level", 2, "int32", "?"), ("stage", 3, "string", "*")],
    "NetStateRule": [("phase", 1, "enum:Phase", "?"), ("min_level", 2, "int32", "?"), ("max_level", 3, "int32", "?"),
                     ("stage", 4, "string", "*"), ("not_stage", 5, "string", "*")],
    "ParamSpec": [("name", 1, "string", "?"), ("share_mode", 2, "enum:DimCheckMode", "?"),
                  ("lr_mult", 3, "float", "?"), ("decay_mult", 4, "float", "?")],
    "FillerParameter": [("type", 1, "string", "?"), ("value", 2, "float", "?"), ("min", 3, "float", "?"),
                        ("max", 4, "float", "?"), ("mean", 5, "float", "?"), ("std", 6, "float", "?"),
                        ("sparse", 7, "int32", "?"), ("variance_norm", 8, "enum:VarianceNorm", "?")],
    # parameters of the layers that read files: kept so that the parser can name what it refuses
    "TransformationParameter": [("scale", 1, "float", "?"), ("mirror", 2, "bool", "?"), ("crop_size", 3, "uint32", "?"),
                                ("mean_file", 4, "string", "?"), ("mean_value", 5, "float", "*")],
    "SourceParameter": [("source", 1, "string", "?"), ("mean_file", 3, "string", "?")],
    "HDF5DataParameter": [("source", 1, "string", "?")],
    "HDF5OutputParameter": [("file_name", 1, "string", "?")],
    "ImageDataParameter": [("source", 1, "string", "?"), ("mean_file", 3, "string", "?"),
                           ("root_folder", 12, "string", "?")],
    "WindowDataParameter": [("source", 1, "string", "?"), ("mean_file", 3, "string", "?"),
                            ("root_folder", 13, "string", "?")],
    "PythonParameter": [("module", 1, "string", "?"), ("layer", 2, "string", "?"), ("param_str", 3, "string", "?")],
    # the translated layers' parameters
    "InputParameter": [("shape", 1, "BlobShape", "*")],
    "ConvolutionParameter": [("num_output", 1, "uint32", "?"), ("bias_term", 2, "bool", "?"), ("pad", 3, "uint32", "*"),
                             ("kernel_size", 4, "uint32", "*"), ("stride", 6, "uint32", "*"),
                             ("dilation", 18, "uint32", "*"), ("pad_h", 9, "uint32", "?"), ("pad_w", 10, "uint32", "?"),
                             ("kernel_h", 11, "uint32", "?"), ("kernel_w", 12, "uint32", "?"),
                             ("stride_h", 13, "uint32", "?"), ("stride_w", 14, "uint32", "?"),
                             ("group", 5, "uint32", "?"), ("weight_filler", 7, "FillerParameter", "?"),
                             ("bias_filler", 8, "FillerParameter", "?"), ("engine", 15, "enum:Engine", "?"),
                             ("axis", 16, "int32", "?"), ("force_nd_im2col", 17, "bool", "?")],
    "PoolingParameter": [("pool", 1, "enum:PoolMethod", "?"), ("pad", 4, "uint32", "?"), ("pad_h", 9, "uint32", "?"),
                         ("pad_w", 10, "uint32", "?"), ("kernel_size", 2, "uint32", "?"), ("kernel_h", 5, "uint32", "?"),
                         ("kernel_w", 6, "uint32", "?"), ("stride", 3, "uint32", "?"), ("stride_h", 7, "uint32", "?"),
                         ("stride_w", 8, "uint32", "?"), ("engine", 11, "enum:Engine", "?"),
                         ("global_pooling", 12, "bool", "?"), ("ceil_mode", 13, "bool", "?")],
    "InnerProductParameter": [("num_output", 1, "uint32", "?"), ("bias_term", 2, "bool", "?"),
                              ("weight_filler", 3, "FillerParameter", "?"), ("bias_filler", 4, "FillerParameter", "?"),
                              ("axis", 5, "int32", "?"), ("transpose", 6, "bool", "?")],
    "ReLUParameter": [("negative_slope", 1, "float", "?"), ("engine", 2, "enum:Engine", "?")],
    "ELUParameter": [("alpha", 1, "float", "?")],
    "PReLUParameter": [("filler", 1, "FillerParameter", "?"), ("channel_shared", 2, "bool", "?")],
    "EngineParameter": [("engine", 1, "enum:Engine", "?")],
    "SoftmaxParameter": [("engine", 1, "enum:Engine", "?"), ("axis", 2, "int32", "?")],
    "BatchNormParameter": [("use_global_stats", 1, "bool", "?"), ("moving_average_fraction", 2, "float", "?"),
                           ("eps", 3, "float", "?"), ("scale_bias", 7, "bool", "?")],
    "ScaleParameter": [("axis", 1, "int32", "?"), ("num_axes", 2, "int32", "?"), ("filler", 3, "FillerParameter", "?"),
                       ("bias_term", 4, "bool", "?"), ("bias_filler", 5, "FillerParameter", "?")],
    "BiasParameter": [("axis", 1, "int32", "?"), ("num_axes", 2, "int32", "?"), ("filler", 3, "FillerParameter", "?")],
    "EltwiseParameter": [("operation", 1, "enum:EltwiseOp", "?"), ("coeff", 2, "float", "*"),
                         ("stable_prod_grad", 3, "bool", "?")],
    "ConcatParameter": [("axis", 2, "int32", "?"), ("concat_dim", 1, "uint32", "?")],
    "FlattenParameter": [("axis", 1, "int32", "?"), ("end_axis", 2, "int32", "?")],
    "ReshapeParameter": [("shape", 1, "BlobShape", "?"), ("axis", 2, "int32", "?"), ("num_axes", 3, "int32", "?")],
    "DropoutParameter": [("dropout_ratio", 1, "float", "?"), ("scale_train", 2, "bool", "?")],
    "LRNParameter": [("local_size", 1, "uint32", "?"), ("alpha", 2, "float", "?"), ("beta", 3, "float", "?"),
                     ("norm_region", 4, "enum:NormRegion", "?"), ("k", 5, "float", "?"), ("engine", 6, "enum:Engine", "?")],
    "PermuteParameter": [("order", 1, "uint32", "*")],
    "PowerParameter": [("power", 1, "float", "?"), ("scale", 2, "float", "?"), ("shift", 3, "float", "?")],
    "CropParameter": [("axis", 1, "int32", "?"), ("offset", 2, "uint32", "*")],
    "SliceParameter": [("axis", 3, "int32", "?"), ("slice_point", 2, "uint32", "*"), ("slice_dim", 1, "uint32", "?")],
    # SSD's layers, as OpenCV's caffe.proto has them (NormalizeBBoxParameter; PriorBoxParameter with
    # OpenCV's offset_h/offset_w/width/height)
    "NormalizeParameter": [("across_spatial", 1, "bool", "?"), ("scale_filler", 2, "FillerParameter", "?"),
                           ("channel_shared", 3, "bool", "?"), ("eps", 4, "float", "?")],
    "PriorBoxParameter": [("min_size", 1, "float", "*"), ("max_size", 2, "float", "*"),
                          ("aspect_ratio", 3, "float", "*"), ("flip", 4, "bool", "?"), ("clip", 5, "bool", "?"),
                          ("variance", 6, "float", "*"), ("img_size", 7, "uint32", "?"), ("img_h", 8, "uint32", "?"),
                          ("img_w", 9, "uint32", "?"), ("step", 10, "float", "?"), ("step_h", 11, "float", "?"),
                          ("step_w", 12, "float", "?"), ("offset", 13, "float", "?"), ("offset_h", 14, "float", "*"),
                          ("offset_w", 15, "float", "*"), ("width", 16, "float", "*"), ("height", 17, "float", "*")],
    "LayerParameter": [
        ("name", 1, "string", "?"), ("type", 2, "string", "?"), ("bottom", 3, "string", "*"), ("top", 4, "string", "*"),
        ("phase", 10, "enum:Phase", "?"), ("loss_weight", 5, "float", "*"), ("param", 6, "ParamSpec", "*"),
        ("blobs", 7, "BlobProto", "*"), ("propagate_down", 11, "bool", "*"), ("include", 8, "NetStateRule", "*"),
        ("exclude", 9, "NetStateRule", "*"), ("transform_param", 100, "TransformationParameter", "?"),
        ("batch_norm_param", 139, "BatchNormParameter", "?"), ("bias_param", 141, "BiasParameter", "?"),
        ("concat_param", 104, "ConcatParameter", "?"), ("convolution_param", 106, "ConvolutionParameter", "?"),
        ("crop_param", 144, "CropParameter", "?"), ("data_param", 107, "SourceParameter", "?"),
        ("dropout_param", 108, "DropoutParameter", "?"), ("eltwise_param", 110, "EltwiseParameter", "?"),
        ("elu_param", 140, "ELUParameter", "?"), ("flatten_param", 135, "FlattenParameter", "?"),
        ("hdf5_data_param", 112, "HDF5DataParameter", "?"), ("hdf5_output_param", 113, "HDF5OutputParameter", "?"),
        ("image_data_param", 115, "ImageDataParameter", "?"), ("inner_product_param", 117, "InnerProductParameter", "?"),
        ("input_param", 143, "InputParameter", "?"), ("lrn_param", 118, "LRNParameter", "?"),
        ("norm_param", 149, "NormalizeParameter", "?"), ("prior_box_param", 150, "PriorBoxParameter", "?"),
        ("permute_param", 148, "PermuteParameter", "?"), ("pooling_param", 121, "PoolingParameter", "?"),
        ("power_param", 122, "PowerParameter", "?"), ("prelu_param", 131, "PReLUParameter", "?"),
        ("python_param", 130, "PythonParameter", "?"), ("relu_param", 123, "ReLUParameter", "?"),
        ("reshape_param", 133, "ReshapeParameter", "?"), ("scale_param", 142, "ScaleParameter", "?"),
        ("sigmoid_param", 124, "EngineParameter", "?"), ("softmax_param", 125, "SoftmaxParameter", "?"),
        ("slice_param", 126, "SliceParameter", "?"), ("tanh_param", 127, "EngineParameter", "?"),
        ("window_data_param", 129, "WindowDataParameter", "?"),
    ],
    "V1LayerParameter": [("bottom", 2, "string", "*"), ("top", 3, "string", "*"), ("name", 4, "string", "?"),
                         ("type", 5, "enum:V1LayerType", "?"), ("blobs", 6, "BlobProto", "*")],
    "NetParameter": [("name", 1, "string", "?"), ("input", 3, "string", "*"), ("input_shape", 8, "BlobShape", "*"),
                     ("input_dim", 4, "int32", "*"), ("force_backward", 5, "bool", "?"), ("state", 6, "NetState", "?"),
                     ("debug_info", 7, "bool", "?"), ("layer", 100, "LayerParameter", "*"),
                     ("layers", 2, "V1LayerParameter", "*")],
    # a caffemodel as the parser reads it: names, types and blobs, nothing else
    "WeightsLayer": [("name", 1, "string", "?"), ("type", 2, "string", "?"), ("blobs", 7, "BlobProto", "*")],
    "WeightsV1Layer": [("name", 4, "string", "?"), ("blobs", 6, "BlobProto", "*")],
    "WeightsNet": [("name", 1, "string", "?"), ("layer", 100, "WeightsLayer", "*"), ("layers", 2, "WeightsV1Layer", "*")],
}
# proto2 defaults that differ from the type's zero
DEFAULTS = {
    ("ConvolutionParameter", "bias_term"): "true", ("ConvolutionParameter", "group"): "1",
    ("ConvolutionParameter", "axis"): "1", ("PoolingParameter", "stride"): "1",
    ("PoolingParameter", "ceil_mode"): "true", ("InnerProductParameter", "bias_term"): "true",
    ("InnerProductParameter", "axis"): "1", ("SoftmaxParameter", "axis"): "1", ("BatchNormParameter", "eps"): "1e-05",
    ("BatchNormParameter", "moving_average_fraction"): "0.999", ("ScaleParameter", "axis"): "1",
    ("ScaleParameter", "num_axes"): "1", ("BiasParameter", "axis"): "1", ("BiasParameter", "num_axes"): "1",
    ("EltwiseParameter", "operation"): "SUM", ("EltwiseParameter", "stable_prod_grad"): "true",
    ("ConcatParameter", "axis"): "1", ("ConcatParameter", "concat_dim"): "1", ("FlattenParameter", "axis"): "1",
    ("FlattenParameter", "end_axis"): "-1", ("ReshapeParameter", "num_axes"): "-1",
    ("DropoutParameter", "dropout_ratio"): "0.5", ("DropoutParameter", "scale_train"): "true",
    ("LRNParameter", "local_size"): "5", ("LRNParameter", "alpha"): "1", ("LRNParameter", "beta"): "0.75",
    ("LRNParameter", "k"): "1", ("PowerParameter", "power"): "1", ("PowerParameter", "scale"): "1",
    ("CropParameter", "axis"): "2", ("SliceParameter", "axis"): "1", ("SliceParameter", "slice_dim"): "1",
    ("ELUParameter", "alpha"): "1", ("NetState", "phase"): "TEST", ("TransformationParameter", "scale"): "1",
    ("NormalizeParameter", "across_spatial"): "true", ("NormalizeParameter", "channel_shared"): "true",
    ("NormalizeParameter", "eps"): "1e-10", ("PriorBoxParameter", "flip"): "true",
    ("PriorBoxParameter", "clip"): "true", ("PriorBoxParameter", "offset"): "0.5",
}


# enums whose value names collide with another enum's in the package scope (MAX, DEFAULT...) are
# nested in a holder message each, as caffe.proto nests them in the messages that use them
NESTED = {"Engine", "PoolMethod", "EltwiseOp", "NormRegion", "VarianceNorm", "DimCheckMode", "Type"}


def _type_name(kind: str) -> str:
    if kind.startswith("enum:"):
        name = kind[5:]
        return f".{PACKAGE}.{name}Holder.{name}" if name in NESTED else f".{PACKAGE}.{name}"
    return f".{PACKAGE}.{kind}"


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="modelport_caffe.proto", package=PACKAGE, syntax="proto2")
    for name, values in ENUMS.items():
        enum = (fd.message_type.add(name=f"{name}Holder").enum_type if name in NESTED else fd.enum_type).add(name=name)
        for i, value in enumerate(values):
            enum.value.add(name=value, number=i)
    enum = fd.enum_type.add(name="V1LayerType")
    for value, number in V1_TYPES.items():
        enum.value.add(name=value, number=number)
    for name, fields in MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for field, number, kind, label in fields:
            f = msg.field.add(name=field, number=number)
            f.label = F.LABEL_REPEATED if label.startswith("*") else F.LABEL_OPTIONAL
            if label == "*p":
                f.options.packed = True
            if kind in SCALARS:
                f.type = SCALARS[kind]
            else:
                f.type = F.TYPE_ENUM if kind.startswith("enum:") else F.TYPE_MESSAGE
                f.type_name = _type_name(kind)
            if (name, field) in DEFAULTS:
                f.default_value = DEFAULTS[(name, field)]
    return fd


def _build() -> dict:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in ("NetParameter", "WeightsNet", "BlobProto", "LayerParameter")}


_CLASSES = _build()
NetParameter = _CLASSES["NetParameter"]
WeightsNet = _CLASSES["WeightsNet"]
BlobProto = _CLASSES["BlobProto"]
LayerParameter = _CLASSES["LayerParameter"]
FLOAT16 = 2  # BlobProto.raw_data_type
FLOAT = 1
