"""nbmpi IPython extension."""
