"""nbmpi controller."""
