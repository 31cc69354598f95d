"""ONNX files: loading, saving and measuring them safely, external data, the stamped contract."""
