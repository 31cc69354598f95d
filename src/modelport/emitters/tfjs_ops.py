"""The TensorFlow ops a TF.js graph model can run: the `tfOpName`s of @tensorflow/tfjs-converter
4.22.0's op mappers (`dist/operations/op_list/*.js`, the list its executor dispatches on), the
version `runtimes/tfjs_node/package.json` pins. A graph holding any other op fails to load in TF.js."""

TFJS_VERSION = "4.22.0"

SUPPORTED_OPS = frozenset((
    "Abs", "Acos", "Acosh", "Add", "AddN", "AddV2", "All", "Any", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan",
    "Atan2", "Atanh", "AvgPool", "AvgPool3D", "BatchMatMul", "BatchMatMulV2", "BatchToSpaceND", "BiasAdd", "Bincount",
    "BitwiseAnd", "BroadcastArgs", "BroadcastTo", "Cast", "Ceil", "ClipByValue", "Complex", "ComplexAbs", "Concat",
    "ConcatV2", "Const", "Conv1D", "Conv2D", "Conv2DBackpropInput", "Conv3D", "Cos", "Cosh", "CropAndResize",
    "Cumprod", "Cumsum", "DenseBincount", "DepthToSpace", "DepthwiseConv2d", "DepthwiseConv2dNative", "Dilation2D",
    "Div", "DivNoNan", "Einsum", "Elu", "EmptyTensorList", "EnsureShape", "Enter", "Equal", "Erf", "EuclideanNorm",
    "Exit", "Exp", "ExpandDims", "Expm1", "FFT", "FakeQuantWithMinMaxVars", "Fill", "Floor", "FloorDiv", "FloorMod",
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "FusedDepthwiseConv2dNative", "Gather", "GatherNd",
    "GatherV2", "Greater", "GreaterEqual", "HashTable", "HashTableV2", "IFFT", "IRFFT", "Identity", "IdentityN", "If",
    "Imag", "ImageProjectiveTransformV3", "InitializeTable", "InitializeTableV2", "IsFinite", "IsInf", "IsNan", "LRN",
    "LeakyRelu", "Less", "LessEqual", "LinSpace", "ListDiff", "Log", "Log1p", "LogSoftmax", "LogicalAnd",
    "LogicalNot", "LogicalOr", "LookupTableFind", "LookupTableFindV2", "LookupTableImport", "LookupTableImportV2",
    "LookupTableSize", "LookupTableSizeV2", "LoopCond", "LowerBound", "MatMul", "MatrixBandPart", "Max", "MaxPool",
    "MaxPool3D", "MaxPoolWithArgmax", "Maximum", "Mean", "Merge", "Min", "Minimum", "MirrorPad", "Mod", "Mul",
    "Multinomial", "Neg", "NextIteration", "NoOp", "NonMaxSuppressionV2", "NonMaxSuppressionV3",
    "NonMaxSuppressionV4", "NonMaxSuppressionV5", "NotEqual", "OneHot", "Ones", "OnesLike", "Pack", "Pad", "PadV2",
    "Placeholder", "PlaceholderWithDefault", "Pow", "Prelu", "Print", "Prod", "RFFT", "RaggedGather", "RaggedRange",
    "RaggedTensorToTensor", "RandomStandardNormal", "RandomUniform", "RandomUniformInt", "Range", "Rank", "Real",
    "RealDiv", "Reciprocal", "Relu", "Relu6", "Reshape", "ResizeBilinear", "ResizeNearestNeighbor", "Reverse",
    "ReverseV2", "Round", "Rsqrt", "ScatterNd", "Select", "SelectV2", "Selu", "Shape", "ShapeN", "Sigmoid", "Sign",
    "SimpleMLCreateModelResource", "SimpleMLInferenceOpWithHandle", "SimpleMLLoadModelFromPathWithHandle", "Sin",
    "Sinh", "Size", "Slice", "Snapshot", "Softmax", "Softplus", "SpaceToBatchND", "SparseFillEmptyRows",
    "SparseReshape", "SparseSegmentMean", "SparseSegmentSum", "SparseToDense", "Split", "SplitV", "Sqrt", "Square",
    "SquaredDifference", "Squeeze", "StatelessIf", "StatelessWhile", "StaticRegexReplace", "StopGradient",
    "StridedSlice", "StringNGrams", "StringSplit", "StringToHashBucketFast", "Sub", "Sum", "Switch", "Tan", "Tanh",
    "TensorArrayCloseV3", "TensorArrayConcatV3", "TensorArrayGatherV3", "TensorArrayReadV3", "TensorArrayScatterV3",
    "TensorArraySizeV3", "TensorArraySplitV3", "TensorArrayV3", "TensorArrayWriteV3", "TensorListConcat",
    "TensorListConcatV2", "TensorListFromTensor", "TensorListGather", "TensorListGetItem", "TensorListLength",
    "TensorListPopBack", "TensorListPushBack", "TensorListReserve", "TensorListResize", "TensorListScatter",
    "TensorListScatterV2", "TensorListSetItem", "TensorListSplit", "TensorListStack", "TensorScatterUpdate", "Tile",
    "TopKV2", "Transpose", "TruncatedNormal", "Unique", "UniqueV2", "Unpack", "UpperBound", "Where", "While", "Zeros",
    "ZerosLike", "_FusedConv2D", "_FusedMatMul",
))
