"""The trace-driven simulator: real cluster traces replayed through the product's own scheduler.

Its hot loop, `engine.py` and `skip.py`, may run compiled: `tools/build_native.py` compiles them with mypyc
into `_native/` (a group of their own: they call the scheduler as Python whether or not it runs compiled),
used only while they match these sources and this interpreter (`gpupool.native`). `NATIVE` says which.
"""

from gpupool.native import use_compiled

NATIVE = use_compiled(__file__, __path__)

__all__ = ["NATIVE"]
