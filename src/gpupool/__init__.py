"""gpupool: one shared, fairly scheduled GPU pool for AI work."""

__version__ = "0.1.0"
