"""mlxspec: speculative decoding on MLX. Same tokens as the target alone, sooner."""

__version__ = "0.1.0"
