"""Backend-independent definitions: config, Walsh/Hadamard construction, quantizers, ops, backends."""
