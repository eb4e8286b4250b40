"""Runnable examples (data ships with scikit-learn; nothing is downloaded)."""
