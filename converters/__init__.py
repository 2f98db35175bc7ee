"""Model converters and writers for edge_sdk (no TensorFlow required)."""
