"""``edge-convert llm``: decoder-only language models (GGUF or a Hugging Face folder) to a
text-generation package with int4/int8/fp16/fp32 ONNX variants, each measured and gated.

Modules: :mod:`.spec` (the shared types: :class:`~.spec.DecoderConfig`,
:class:`~.spec.DecoderSource`, errors), :mod:`.sources` (reading GGUF and safetensors),
:mod:`.tokenizer_gguf` (a ``tokenizer.json`` from GGUF metadata), :mod:`.reference` (a numpy
forward pass, the float reference), :mod:`.quant` (int4/int8 block quantizers),
:mod:`.graph` (the ONNX graph on ONNX Runtime's fused contrib ops), :mod:`.convert` (the whole
job: variants, quality, gates, package).
"""
