"""The Open Inference Protocol (KServe v2), over REST (:mod:`.rest`) and gRPC (:mod:`.grpc`):
its messages (:mod:`.schemas`), its tensors (:mod:`.tensors`), and the gRPC messages and service
generated from ``inference.proto`` (``make proto``)."""
