"""The audit log: queries, exports and retention."""
