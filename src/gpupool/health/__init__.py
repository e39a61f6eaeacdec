"""Node health: Xid classification, per-model thresholds, passive and active checks, and verdicts."""
