"""The ONNX differential fuzzer: random valid graphs of the operators tcc.onnx claims, each run
by tcc and by onnxruntime in a worker process (``python -m fuzz.onnx``, ``make fuzz-onnx``)."""
