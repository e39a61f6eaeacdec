"""The trace-driven simulator: real cluster traces replayed through the product's own scheduler."""
