"""Framework loading that parsers and native-route emitters share, below both of them: TensorFlow
imported quietly, a SavedModel loaded. A parser reads a model through here to convert it; a native
route reads the same source through here to hand it to the framework's own converter.
"""
