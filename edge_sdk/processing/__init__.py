"""Pure functions over numpy: image preprocessing and output decoders."""
